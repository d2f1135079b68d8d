"""A program for the sharded-memory tests, run by torchrun with gloo on 2 CPU ranks: DDP (its buckets its own, then
the gradients views of them) and FSDP2 (`fully_shard` per block, bf16 `MixedPrecisionPolicy`, AdamW), each a few
steps. Every new storage an operator makes is logged with the Python stack it was made from, as the CUDA memory
recorder would stack it; the recorder's list of storages is taken mid-forward and after the optimizer step; and
what the program holds (its local shards, their optimizer state) is written beside them, to OUT/rank<R>.json."""

import json
import os
import sys
import traceback

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint

from profiler_kit.memory.storages import capture_storages

# Frames of the dispatch machinery between the operator and the code that called it, which the CUDA recorder's
# stacks do not hold.
MACHINERY = ("_python_dispatch", "torch/_dynamo", "torch/_compile.py")


def address(value) -> int | None:
    """A plain tensor's storage address; None for anything else (a DTensor's own storage is not real)."""
    if type(value) is not torch.Tensor and type(value) is not torch.nn.Parameter:
        return None
    return value.untyped_storage().data_ptr()


class Allocations(TorchDispatchMode):
    """Each storage an operator makes (not a view or an in-place result): its bytes, the phase the program was in,
    and its stack, innermost frame first, as the memory recorder's frames."""

    def __init__(self) -> None:
        super().__init__()
        self.phase = ""
        self.rows: list[dict] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {address(a) for a in torch.utils._pytree.tree_leaves((args, kwargs))}
        stack = traceback.extract_stack()
        frames = [{"filename": f.filename, "name": f.name, "line": f.lineno} for f in reversed(stack)
                  if not any(m in f.filename for m in MACHINERY) and f.name != "__torch_dispatch__"]
        for t in torch.utils._pytree.tree_leaves(out):
            if address(t) is not None and address(t) not in inputs:
                self.rows.append({"op": str(func), "bytes": t.untyped_storage().nbytes(), "phase": self.phase,
                                  "frames": frames})
        return out


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(width, 2 * width)
        self.down = torch.nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


def model(width: int = 16, depth: int = 2) -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[Block(width) for _ in range(depth)])


def sizes(capture: dict) -> dict:
    return {k: sorted(n for _, n in v) if isinstance(v, list) else v for k, v in capture.items()}


def ddp(log: Allocations, view: bool) -> dict:
    log.phase = "build"
    net = DistributedDataParallel(model(), gradient_as_bucket_view=view)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for step in range(2):
        log.phase = f"forward {step}"
        loss = net(torch.randn(4, 16)).sum()
        log.phase = f"backward {step}"
        loss.backward()
        log.phase = f"optimizer {step}"
        opt.step()
        opt.zero_grad(set_to_none=not view)
    capture = capture_storages([], [opt], "after", modules=list(net.modules()))
    return {"capture": sizes(capture), "parameter_bytes": sorted(p.nbytes for p in net.parameters())}


def fsdp(log: Allocations, recompute: bool) -> dict:
    log.phase = "build"
    net = model()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in net:
        fully_shard(block, mp_policy=policy)
    fully_shard(net, mp_policy=policy, reshard_after_forward=False)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    captures = []
    for step in range(2):
        log.phase = f"forward {step}"
        x = torch.randn(4, 16)
        for block in net:
            x = checkpoint(block, x, use_reentrant=False) if recompute else block(x)
        captures.append(sizes(capture_storages([], [opt], "mid-forward", modules=list(net.modules()))))
        log.phase = f"backward {step}"
        x.float().sum().backward()
        log.phase = f"optimizer {step}"
        opt.step()
        opt.zero_grad()
    captures.append(sizes(capture_storages([], [opt], "after", modules=list(net.modules()))))
    local = [p.to_local() for p in net.parameters()]
    return {"captures": captures, "local_shard_bytes": sorted(t.numel() * t.element_size() for t in local),
            "unsharded_bf16_bytes": sorted(p.numel() * 2 for p in net.parameters())}


def main() -> None:
    dist.init_process_group("gloo")
    out = {}
    with Allocations() as log:
        for view in (False, True):
            out[f"ddp view={view}"] = ddp(log, view)
            out[f"ddp view={view}"]["allocations"], log.rows = log.rows, []
        out["fsdp"] = fsdp(log, recompute=True)
        out["fsdp"]["allocations"], log.rows = log.rows, []
    path = os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json")
    with open(path, "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
