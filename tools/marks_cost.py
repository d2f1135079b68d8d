"""What the recorder's automatic marks cost: the built-in workload's eager step with and without them.

The marks (`profiler_kit.recording.marks`: global module forward hooks, the backward wrapper, global optimizer
step hooks, and the NVTX start/end ranges they open) are installed in this process and taken off again, in
alternating blocks of steps after a warm-up, so both sides see the same GPU clocks and host load; each step is
timed to its end (synchronized). The cost is the median step with the marks against the median step without,
in percent. Run it with the project's python from the repository root (on a machine without the installed
package: PYTHONPATH=$PWD), e.g. on an H100: `python tools/marks_cost.py --model small --ctx 256
--mixed-precision`. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from profiler_kit.device import synchronize
from profiler_kit.presets import PRESETS
from profiler_kit.recording.marks import Marks
from profiler_kit.recording.notes import Notes
from profiler_kit.workload import MODES, Workload, WorkloadConfig


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small", choices=sorted(PRESETS), help="model preset (default: small)")
    parser.add_argument("--ctx", type=int, default=256, help="context length (default: 256)")
    parser.add_argument("--mode", default="train", choices=MODES, help="default: train")
    parser.add_argument("--batch-size", type=int, default=4, help="default: 4")
    parser.add_argument("--mixed-precision", action="store_true", help="bf16 autocast")
    parser.add_argument("--device", default="auto", help="auto, cuda or cpu (default: auto)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first (default: 10)")
    parser.add_argument("--blocks", type=int, default=10, help="blocks of each side, alternating (default: 10)")
    parser.add_argument("--block-steps", type=int, default=5, help="steps per block (default: 5)")
    return parser.parse_args()


def timed_steps(workload: Workload, steps: int) -> list[float]:
    """Milliseconds of each of `steps` steps, each synchronized at its end."""
    times = []
    for _ in range(steps):
        began = time.perf_counter()
        workload.step()
        synchronize(workload.device)
        times.append((time.perf_counter() - began) * 1000)
    return times


def main() -> None:
    args = parse_args()
    cfg = WorkloadConfig(args.model, args.ctx, args.mode, args.batch_size, args.mixed_precision, device=args.device)
    workload = Workload(cfg)
    marks = Marks(Notes())
    timed_steps(workload, args.warmup)
    plain: list[float] = []
    marked: list[float] = []
    for block in range(2 * args.blocks):
        with_marks = block % 2 == 1
        if with_marks:
            marks.install()
        (marked if with_marks else plain).extend(timed_steps(workload, args.block_steps))
        if with_marks:
            marks.finish()
            marks.remove()
    a, b = statistics.median(plain), statistics.median(marked)
    print(json.dumps({
        "config": cfg.as_dict(), "device": torch.cuda.get_device_name() if workload.device.type == "cuda" else "cpu",
        "steps_each": len(plain), "plain_median_ms": round(a, 3), "marked_median_ms": round(b, 3),
        "cost_pct": round((b / a - 1) * 100, 2), "notes": marks.notes.lines,
    }))


if __name__ == "__main__":
    main()
