"""A plain GPT training loop that knows nothing of profiler-kit, profiled from outside:

    profiler-kit nsys -- python examples/train_plain.py                   # Nsight Systems
    profiler-kit nsys --backend torch -- python examples/train_plain.py   # torch.profiler, any machine
    profiler-kit memory -- python examples/train_plain.py                 # the CUDA memory history
    profiler-kit nsys -- torchrun --nproc-per-node 2 examples/train_plain.py   # data-parallel, one report

A causal Transformer language model (torch's own layers) on random tokens: each step runs `--accum`
micro-batches of forward and backward (gradient accumulation), clips the gradients and takes an AdamW step. It
opens no range and no window: the recorder finds forward, backward, optimizer_step and the steps itself (its
automatic marks), so the summary has them per phase and per step. `--record-function` wraps the phases in
`torch.profiler.record_function` ranges of its own instead (`fwd`, `bwd`, `opt`), whose names then win;
`--checkpoint` recomputes every other block in backward (activation checkpointing); `--compile` compiles the
model. Under torchrun it trains data-parallel (DistributedDataParallel over NCCL on GPUs, gloo on CPUs, one
GPU per rank). The program times its own steps (synchronizing on a GPU) and prints one JSON line when it is
done (rank 0's under torchrun): `{"step_ms": [...], "mean_last5_ms": ...}`.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from contextlib import nullcontext

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class GPT(nn.Module):
    """A causal Transformer language model from torch's own layers; `checkpointed` blocks are recomputed in
    backward."""

    def __init__(self, vocab: int, width: int, depth: int, heads: int, checkpointed: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)
        self.checkpointed = checkpointed

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens)
        for i, block in enumerate(self.blocks):
            if self.checkpointed and i % 2:
                x = checkpoint(block, x, mask, None, True, use_reentrant=False)
            else:
                x = block(x, src_mask=mask, is_causal=True)
        logits = self.head(self.norm(x))
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--accum", type=int, default=2, help="micro-batches per step (gradient accumulation)")
    parser.add_argument("--clip", type=float, default=1.0, help="gradient norm clipping")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--checkpoint", action="store_true", help="recompute every other block in backward")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--record-function", action="store_true",
                        help="wrap the phases in record_function ranges fwd, bwd, opt")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    distributed = "RANK" in os.environ
    device = torch.device(args.device)
    if distributed:
        import torch.distributed as dist

        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
            torch.cuda.set_device(device)
    torch.manual_seed(0)  # the same initial weights on every rank
    model = GPT(args.vocab, args.width, args.depth, args.heads, args.checkpoint).to(device)
    run = torch.compile(model) if args.compile else model
    if distributed:
        run = nn.parallel.DistributedDataParallel(run, device_ids=[device] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device.type == "cuda")
    data = torch.randint(0, args.vocab, (args.accum, args.batch, args.seq + 1), device=device)

    def ranged(name: str):
        return torch.profiler.record_function(name) if args.record_function else nullcontext()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    times = []
    for _ in range(args.steps):
        sync()
        began = time.perf_counter()
        for micro in range(args.accum):
            with ranged("fwd"):
                loss = run(data[micro, :, :-1], data[micro, :, 1:]) / args.accum
            with ranged("bwd"):
                loss.backward()
        with ranged("opt"):
            nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        sync()
        times.append((time.perf_counter() - began) * 1000)
    last = times[-5:]
    if not distributed or dist.get_rank() == 0:
        print(json.dumps({"step_ms": [round(t, 3) for t in times], "mean_last5_ms": round(sum(last) / len(last), 3),
                          "loss": round(loss.item() * args.accum, 4)}))
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
