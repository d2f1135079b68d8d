"""An FSDP2 training program as users write one, for the tests and the GPU checks: the example language model
(examples/train_mlp.py) with `fully_shard` on each block, then the root, with bf16 parameters for compute and
fp32 gradient reduction (`MixedPrecisionPolicy`), its phases marked with `torch.cuda.nvtx` ranges; NCCL on GPUs
(one per rank), gloo on CPUs, started by torchrun:

    torchrun --nproc-per-node 2 tests/distributed/fsdp2_program.py --warmup 2 --steps 6     (8 steps)

A CPU build of torch has no NVTX: on a CPU the program runs under a profiler-kit recorder, which takes its ranges.
Rank 0 prints the last loss.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.cuda import nvtx
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from train_mlp import MLPLanguageModel, add_training_arguments  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_training_arguments(parser)
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    torch.manual_seed(0)
    model = MLPLanguageModel(args.vocab, args.width, args.depth).to(device)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(dist.get_rank())
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=generator).to(device)
    for _ in range(args.warmup + args.steps):
        with nvtx.range("step"):
            with nvtx.range("forward"):
                logits = model(tokens[:, :-1]).float()
                loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
            with nvtx.range("backward"):
                loss.backward()
            with nvtx.range("optimizer"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    if dist.get_rank() == 0:
        print(f"loss {loss.item():.4f} after {args.warmup + args.steps} steps on {dist.get_world_size()} ranks")
    # The sharded model holds the process group: freed before the group is destroyed, as ddp_program.py does.
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
