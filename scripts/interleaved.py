"""What the step 22 and 23 benches share: the issue 6 shapes and the command line, implementations timed in
interleaved rounds, and their markdown table.

`pooled_rounds` times each callable once per round, in an order that alternates from round to round (first to
last, then last to first), do_bench with the L2 flushed and `rep_ms` per round, and pools the calls.
`print_table` prints the pooled medians [p20, p80], TFLOP/s and the reference's ms over each one's, fastest first,
and returns the fastest label among those starting with `prefix`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch

from profiler_kit.attention.bench import Timing, sample_ms

# name: (batch, heads, seq, d, causal): the issue 6 shapes, then the leaderboard's non-causal twin and the seeds'
# grid's largest d = 64 shape (the other d = 64 calls that reach the fused backward's default, step 24).
SHAPES = {
    "causal4096": (4, 16, 4096, 128, True),
    "full8192": (4, 16, 8192, 128, False),
    "leaderboard": (1, 16, 16384, 64, True),
    "full16384d64": (1, 16, 16384, 64, False),
    "grid16384d64": (8, 1, 16384, 64, True),
}


def run_shapes(doc: str, measure: Callable[[str, int, float, Path | None], None]) -> None:
    """A bench's command line (--shapes, --rounds, --rep-ms, --best-dir; `doc`'s first line as its description):
    the device, then `measure(name, rounds, rep_ms, best_dir)` for each shape named."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--shapes", default="causal4096,full8192,leaderboard")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rep-ms", type=float, default=100.0)
    parser.add_argument("--best-dir", type=Path, default=None)
    args = parser.parse_args()
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for name in args.shapes.split(","):
        measure(name, args.rounds, args.rep_ms, args.best_dir)


def pooled_rounds(impls: dict[str, Callable[[], object]], device: torch.device, rounds: int,
                  rep_ms: float) -> dict[str, list[float]]:
    """Per label, the ms of every timed call over `rounds` interleaved rounds (module docstring)."""
    samples: dict[str, list[float]] = {label: [] for label in impls}
    order = list(impls)
    for r in range(rounds):
        for label in (order if r % 2 == 0 else order[::-1]):
            samples[label] += sample_ms(impls[label], device, 25.0, rep_ms)
    return samples


def print_table(what: str, samples: dict[str, list[float]], flops: float, reference: str = "cudnn",
                prefix: str = "") -> str | None:
    """Print one shape's table (module docstring); the fastest label starting with `prefix`, if any."""
    print(f"| {what} | median ms [p20, p80] | TFLOP/s | cuDNN ms / ms |")
    print("|---|---|---:|---:|")
    reference_ms = Timing.of(samples[reference]).median_ms
    ranked = sorted(samples, key=lambda label: Timing.of(samples[label]).median_ms)
    for label in ranked:
        t = Timing.of(samples[label])
        print(f"| {label} | {t.median_ms:.3f} [{t.p20_ms:.3f}, {t.p80_ms:.3f}] | {flops / t.median_ms / 1e9:.1f} "
              f"| {reference_ms / t.median_ms:.3f} |")
    return next((label for label in ranked if prefix and label.startswith(prefix)), None)
