"""The example model trained data-parallel, one process per rank, to profile a distributed job:

    profiler-kit nsys --backend torch -o profiles/ddp -- torchrun --nproc-per-node 2 examples/train_ddp.py

writes one trace per rank (profiles/ddp.rank0.json.gz, ...). DistributedDataParallel averages gradients over
NCCL on GPUs (one GPU per rank) and over gloo on CPUs, overlapping the all-reduce with the backward pass.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from train_mlp import MLPLanguageModel, add_training_arguments, train

import profiler_kit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_training_arguments(parser)
    args = parser.parse_args()

    cap = profiler_kit.capture(warmup=args.warmup, steps=args.steps)  # before the first CUDA call
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    torch.manual_seed(0)  # the same initial weights on every rank
    model = MLPLanguageModel(args.vocab, args.width, args.depth).to(device)
    ddp = DistributedDataParallel(model, device_ids=[device] if cuda else None)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(dist.get_rank())  # each rank its own batch
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=generator).to(device)
    loss = train(cap, ddp, optimizer, tokens, args.warmup + args.steps)
    if dist.get_rank() == 0:
        print(f"loss {loss.item():.3f} after {args.warmup + args.steps} steps on {dist.get_world_size()} ranks")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
