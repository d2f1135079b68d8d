"""A training program of its own, profiled by profiler-kit without running under it:

    profiler-kit nsys -- python examples/train_mlp.py                  # Nsight Systems
    profiler-kit nsys --backend torch -- python examples/train_mlp.py  # torch.profiler, also on a CPU

A residual MLP language model on random tokens; each step is a range `step` holding `fwd`, `bwd` and `opt`,
every block has forward and backward ranges, and only steps `--warmup` to `--warmup + --steps - 1` are
recorded. It runs the same without any profiler.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import profiler_kit


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class MLPLanguageModel(nn.Module):
    def __init__(self, vocab: int, width: int, depth: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.Sequential(*(Block(width) for _ in range(depth)))
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens)))


def add_training_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the model size, batch shape and recorded-step options shared by the example programs."""
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)


def train(
    cap: profiler_kit.capture,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    tokens: torch.Tensor,
    steps: int,
) -> torch.Tensor:
    """Run `steps` next-token training steps on `tokens` inside `cap`, each step holding `fwd`, `bwd` and `opt`."""
    with cap:
        for _ in range(steps):
            with cap.step():
                with profiler_kit.phase("fwd"):
                    logits = model(tokens[:, :-1])
                    loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
                with profiler_kit.phase("bwd"):
                    loss.backward()
                with profiler_kit.phase("opt"):
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
    return loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_training_arguments(parser)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    cap = profiler_kit.capture(warmup=args.warmup, steps=args.steps)  # before the first CUDA call
    model = MLPLanguageModel(args.vocab, args.width, args.depth).to(args.device)
    profiler_kit.instrument(model, depth=2)  # blocks.0.forward, blocks.0.backward, ...
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device=args.device)
    loss = train(cap, model, optimizer, tokens, args.warmup + args.steps)
    print(f"loss {loss.item():.3f} after {args.warmup + args.steps} steps")


if __name__ == "__main__":
    main()
