"""A plain training program that records its own CUDA memory snapshot with torch's API, and nothing of
profiler-kit, for `profiler-kit memory summarize` to explain:

    python examples/memory_plain.py --out memory_snapshots/plain.pickle
    profiler-kit memory summarize memory_snapshots/plain.pickle
    profiler-kit memory -- python examples/memory_plain.py --window     # recorded from outside instead

A causal Transformer language model (torch's own layers) on random tokens, trained with AdamW (fused by
default) or SGD with momentum. The history starts after `--warmup` steps (so parameters and optimizer state are
older than the trace), `--steps` steps are recorded, and no range names a phase unless `--ranges` wraps them in
`record_function` ranges. It prints what the program holds after its last step (parameters, their gradients,
the optimizer's state on the GPU, in bytes) so that the report's roles can be checked against it. Needs a CUDA
device.

With `--window` it records nothing itself: it opens a `torch.cuda.profiler.start()`/`stop()` window around the
recorded steps instead, the window `profiler-kit memory -- COMMAND` records.
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
from contextlib import nullcontext

import torch
from torch import nn


class Model(nn.Module):
    """A causal Transformer language model from torch's own layers."""

    def __init__(self, vocab: int, width: int, depth: int, heads: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.layers = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], device=tokens.device)
        return self.head(self.layers(self.embed(tokens), mask=mask, is_causal=True))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="the snapshot pickle to write (needed unless --window)")
    parser.add_argument("--window", action="store_true",
                        help="record nothing: open a torch.cuda.profiler window around the recorded steps")
    parser.add_argument("--optimizer", choices=["adamw-fused", "adamw-foreach", "sgd-momentum"],
                        default="adamw-fused")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--warmup", type=int, default=2, help="steps before the history starts")
    parser.add_argument("--steps", type=int, default=2, help="recorded steps")
    parser.add_argument("--ranges", action="store_true",
                        help="wrap forward, backward and optimizer in record_function ranges")
    args = parser.parse_args()
    if not args.window and args.out is None:
        parser.error("--out is needed unless --window")
    return args


def make_optimizer(name: str, params) -> torch.optim.Optimizer:
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=1e-2, momentum=0.9)
    return torch.optim.AdamW(params, lr=1e-4, fused=name == "adamw-fused", foreach=name == "adamw-foreach" or None)


def step(model: Model, optimizer: torch.optim.Optimizer, tokens: torch.Tensor, ranges: bool) -> None:
    def phase(name: str):
        return torch.profiler.record_function(name) if ranges else nullcontext()

    optimizer.zero_grad(set_to_none=True)
    with phase("forward"):
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    with phase("backward"):
        loss.backward()
    with phase("optimizer"):
        optimizer.step()


def held_bytes(model: Model, optimizer: torch.optim.Optimizer) -> dict:
    """What the program holds after a step: parameters, gradients and optimizer state, by storage."""
    params = list(model.parameters())
    state = [t for p in params for t in optimizer.state[p].values() if torch.is_tensor(t) and t.is_cuda]
    return {
        "parameters": sum(p.numel() for p in params),
        "parameter_bytes": sum(p.untyped_storage().nbytes() for p in params),
        "gradient_bytes": sum(p.grad.untyped_storage().nbytes() for p in params if p.grad is not None),
        "optimizer_state_bytes": sum(t.untyped_storage().nbytes() for t in state),
        "optimizer_state_tensors": len(state),
    }


def main() -> None:
    args = parse_args()
    if not torch.cuda.is_available():
        sys.exit("memory_plain.py: CUDA memory history needs a CUDA device")
    torch.manual_seed(0)
    model = Model(args.vocab, args.width, args.depth, args.heads).cuda()
    optimizer = make_optimizer(args.optimizer, model.parameters())
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device="cuda")

    def steps(count: int) -> None:
        for _ in range(count):
            step(model, optimizer, tokens, args.ranges)
        torch.cuda.synchronize()

    steps(args.warmup)
    if args.window:
        torch.cuda.profiler.start()
    else:
        torch.cuda.memory._record_memory_history(max_entries=200_000)
    steps(args.steps)
    if args.window:
        torch.cuda.profiler.stop()
    else:
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        with open(args.out, "wb") as fh:
            pickle.dump(snapshot, fh, protocol=4)
    print(json.dumps({"snapshot": args.out, "optimizer": args.optimizer, **held_bytes(model, optimizer)}))


if __name__ == "__main__":
    main()
