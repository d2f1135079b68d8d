"""A data-parallel training program as users write one, for the tests and the GPU checks: the example language
model (examples/train_mlp.py) in DistributedDataParallel over NCCL on GPUs (one per rank, `cuda:LOCAL_RANK`) and
gloo on CPUs, started by torchrun:

    torchrun --nproc-per-node 2 tests/distributed/ddp_program.py --warmup 2 --steps 6 [--marks] [--capture]
        [--bind-device] [--late-rank 1 --late-s 1.5 --late-at collective]

It runs `--warmup` + `--steps` steps, plain by default (no annotation at all); `--marks` puts
`profiler_kit.phase` ranges around each step and its forward, backward and optimizer; `--capture` records the
last `--steps` only (`profiler_kit.capture`).
`--late-rank R` makes rank R start late: it sleeps before `init_process_group` (`--late-at init`) or after it,
before the first collective (`--late-at collective`, DDP's check of the parameters' shapes); each rank then writes
`{"entered": NS, "rank": R}` on stderr when it calls that collective (host clock, ns). NCCL sets up its
communicator at the first collective unless `--bind-device` gives `init_process_group` the rank's GPU, which
sets it up there. Rank 0 prints the last loss.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import profiler_kit

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from train_mlp import MLPLanguageModel, add_training_arguments  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_training_arguments(parser)
    parser.add_argument("--marks", action="store_true")
    parser.add_argument("--capture", action="store_true")
    parser.add_argument("--late-rank", type=int)
    parser.add_argument("--late-s", type=float, default=1.0)
    parser.add_argument("--late-at", choices=("init", "collective"), default="collective")
    parser.add_argument("--bind-device", action="store_true")
    args = parser.parse_args()

    cap = profiler_kit.capture(args.warmup, args.steps) if args.capture else None  # before the first CUDA call
    mark = profiler_kit.phase if args.marks else lambda name: contextlib.nullcontext()
    rank = int(os.environ["RANK"])
    late = args.late_rank == rank
    if late and args.late_at == "init":
        time.sleep(args.late_s)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda and args.bind_device else None)
    if late and args.late_at == "collective":
        time.sleep(args.late_s)
    torch.manual_seed(0)  # the same weights on every rank
    model = MLPLanguageModel(args.vocab, args.width, args.depth).to(device)
    if args.late_rank is not None:  # when this rank calls DDP's first collective, on the host's clock, one write
        os.write(2, (json.dumps({"entered": time.time_ns(), "rank": rank}) + "\n").encode())
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(rank)  # a batch of its own on each rank
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=generator).to(device)
    for _ in range(args.warmup + args.steps):
        with cap.step() if cap else mark("step"):
            with mark("forward"):
                logits = ddp(tokens[:, :-1])
                loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
            with mark("backward"):
                loss.backward()
            with mark("optimizer"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    if rank == 0:
        print(f"loss {loss.item():.4f} after {args.warmup + args.steps} steps on {dist.get_world_size()} ranks")
    # DDP's reducer holds the process group: freed here, where gloo's worker threads can still take the GIL to free
    # their last work, not as main() returns, where freeing the group joins them with the GIL held (a deadlock
    # of torch's gloo that a profiler's timing makes likely).
    del ddp
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
