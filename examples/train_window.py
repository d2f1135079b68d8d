"""A training program that knows nothing of profiler-kit: `torch.cuda.nvtx` ranges and its own profiler window.

    profiler-kit nsys -- python examples/train_window.py                  # Nsight Systems, the window only
    profiler-kit nsys --backend torch -- python examples/train_window.py  # torch.profiler, the same ranges

A Transformer-style MLP language model on random tokens, trained with AdamW (fused on a GPU) and, on a GPU,
fp16 autocast with a gradient scaler. Each step is a `torch.cuda.nvtx` range `step` holding `fwd`, `bwd` and
`opt`; the program opens `torch.cuda.profiler.start()` before step `--warmup` and `stop()` after `--steps` more,
the usual way to keep start-up, warm-up and the tail out of a `--capture-range=cudaProfilerApi` recording.
Without a profiler it runs on a GPU only (torch.cuda.nvtx needs CUDA); under `profiler-kit nsys --backend
torch` it also runs on a CPU.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn


def make_model(vocab: int, width: int, depth: int) -> nn.Module:
    blocks = [nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
              for _ in range(depth)]
    return nn.Sequential(nn.Embedding(vocab, width), *blocks, nn.LayerNorm(width), nn.Linear(width, vocab))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--warmup", type=int, default=3, help="steps before the window")
    parser.add_argument("--steps", type=int, default=3, help="steps in the window")
    parser.add_argument("--after", type=int, default=2, help="steps after the window")
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    model = make_model(args.vocab, args.width, args.depth).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
    scaler = torch.amp.GradScaler("cuda", enabled=cuda)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device=device)
    for i in range(args.warmup + args.steps + args.after):
        if i == args.warmup:
            torch.cuda.profiler.start()
        torch.cuda.nvtx.range_push("step")
        with torch.cuda.nvtx.range("fwd"), torch.autocast(device.type, torch.float16, enabled=cuda):
            logits = model(tokens[:, :-1])
            loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        with torch.cuda.nvtx.range("bwd"):
            scaler.scale(loss).backward()
        with torch.cuda.nvtx.range("opt"):
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
        torch.cuda.nvtx.range_pop()
        if i == args.warmup + args.steps - 1:
            if cuda:
                torch.cuda.synchronize()
            torch.cuda.profiler.stop()
    print(f"loss {loss.item():.3f} after {args.warmup + args.steps + args.after} steps")


if __name__ == "__main__":
    main()
