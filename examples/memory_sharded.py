"""A sharded training program of its own, recorded from outside on 2 GPUs (torchrun, NCCL), with no
annotations: a stack of MLP blocks with layer norms, wrapped in DDP or in FSDP2 (`fully_shard` per block and on
the root, bf16 `MixedPrecisionPolicy` with fp32 gradient reduction), AdamW, a few steps on random data.

    profiler-kit memory -o OUT -- torchrun --standalone --nproc-per-node 2 examples/memory_sharded.py \\
        --parallel fsdp

After its last step each rank prints one JSON line on stderr (`{"held": ...}`) with what it holds: the bytes of
its parameters (its local shards under FSDP2, as `numel × element size`), of AdamW's state on the GPU, and of its
gradients; the memory report's roles are checked against it. The widths are even, so FSDP2's shards need no
padding.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from train_mlp import Block


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parallel", choices=["ddp", "fsdp"], required=True)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=4)
    return parser.parse_args()


def wrap(model: nn.Sequential, parallel: str, device: torch.device) -> nn.Module:
    if parallel == "ddp":
        return nn.parallel.DistributedDataParallel(model.to(device), device_ids=[device.index])
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model.to(device)
    for block in model:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard; a plain tensor itself."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def held(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    params = list(model.parameters())
    state = [local(t) for p in params for t in optimizer.state[p].values() if torch.is_tensor(t)]
    return {
        "rank": dist.get_rank(),
        "parameter_bytes": sum(local(p).numel() * local(p).element_size() for p in params),
        "parameter_fp32_bytes": sum(local(p).numel() * 4 for p in params),
        "optimizer_state_bytes": sum(t.numel() * t.element_size() for t in state if t.is_cuda),
        "gradient_bytes": sum(local(p.grad).numel() * local(p.grad).element_size() for p in params
                              if p.grad is not None),
    }


def main() -> None:
    args = parse_args()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    torch.manual_seed(0)
    model = wrap(nn.Sequential(*[Block(args.width) for _ in range(args.depth)]), args.parallel, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(args.batch, args.seq, args.width, device=device)
    for _ in range(args.steps):
        loss = model(x).float().pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)  # the gradients stay, so the roles can be checked against them
    torch.cuda.synchronize()
    print(json.dumps({"held": held(model, optimizer)}), file=sys.stderr, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
