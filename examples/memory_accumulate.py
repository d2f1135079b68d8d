"""A training program of its own with no annotations, recorded from outside on one GPU: a stack of MLP blocks,
every other one under activation checkpointing (its forward runs again inside the backward), `--micro-batches`
forwards and backwards per step (gradient accumulation), gradient clipping and AdamW, `--steps` steps.

    profiler-kit memory -o OUT -- python examples/memory_accumulate.py

The last micro-batch of the last step is the largest, so the peak falls in that step's last backward. It prints
one JSON line on stderr (`{"loop": ...}`) with its steps and micro-batches.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from train_mlp import Block


class Model(nn.Module):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(self.blocks):
            x = checkpoint(block, x, use_reentrant=False) if i % 2 else block(x)
        return x.float().pow(2).mean()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--micro-batches", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Model(args.width, args.depth).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(args.steps):
        for k in range(args.micro_batches):
            last = step == args.steps - 1 and k == args.micro_batches - 1
            x = torch.randn(args.batch + 2 * last, args.seq, args.width, device="cuda")
            (model(x) / args.micro_batches).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    print(json.dumps({"loop": {"steps": args.steps, "micro_batches": args.micro_batches}}), file=sys.stderr)


if __name__ == "__main__":
    main()
