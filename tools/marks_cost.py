"""What the recorder's automatic marks and module marks cost: the built-in workload's eager step without them,
with the automatic marks, and with the module marks too.

The marks (`profiler_kit.recording.marks`: global module forward hooks, the backward wrapper, global optimizer
step hooks, and the NVTX start/end ranges they open) and the module marks (`profiler_kit.recording.modules`, at
`--modules`: a range per module call, hooks on the autograd nodes of each call for its backward range) are
installed in this process and taken off again, in rotating blocks of steps after a warm-up, so every side sees
the same GPU clocks and host load; each step is timed to its end (synchronized). `cost_pct` is the median step
with the automatic marks against the median step without; `modules_cost_pct` the median step with the module
marks too against the one with the automatic marks alone (the FLOP count, which runs in one step outside the
timed ones, is left out). Run it with the project's python from the repository root (on a machine without the
installed package: PYTHONPATH=$PWD), e.g. on an H100: `python tools/marks_cost.py --model small --ctx 256
--mixed-precision --modules depth:3`. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from profiler_kit.defaults import DEFAULT_MODULES
from profiler_kit.device import synchronize
from profiler_kit.errors import ProfilerKitError
from profiler_kit.names import module_depth
from profiler_kit.presets import PRESETS
from profiler_kit.recording import modules
from profiler_kit.recording.marks import Marks
from profiler_kit.recording.modules import ModuleMarks
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
    parser.add_argument("--modules", default=DEFAULT_MODULES, type=module_depth_setting,
                        help=f"module marks: depth:N, all or none (default: {DEFAULT_MODULES})")
    return parser.parse_args()


def module_depth_setting(text: str) -> str:
    try:
        module_depth(text)
    except ProfilerKitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def module_ranges_per_step(workload: Workload, marks: Marks) -> int:
    """How many module ranges (forward, backward, recomputation) one step opens."""
    opened = []
    start = modules.module_start
    modules.module_start = lambda *args: opened.append(1) or start(*args)
    marks.install()
    try:
        workload.step()
        synchronize(workload.device)
    finally:
        marks.finish()
        marks.remove()
        modules.module_start = start
    return len(opened)


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
    notes = Notes()
    depth = module_depth(args.modules)
    sides = {"plain": None, "marked": Marks(notes)}
    if depth != 0:
        sides["modules"] = Marks(notes, ModuleMarks(notes, depth))
    timed_steps(workload, args.warmup)
    ranges = module_ranges_per_step(workload, sides["modules"]) if "modules" in sides else 0
    times: dict[str, list[float]] = {side: [] for side in sides}
    for block in range(len(sides) * args.blocks):
        side = list(sides)[block % len(sides)]
        marks = sides[side]
        if marks is not None:
            marks.install()
        times[side].extend(timed_steps(workload, args.block_steps))
        if marks is not None:
            marks.finish()
            marks.remove()
    median = {side: statistics.median(values) for side, values in times.items()}
    a, b = median["plain"], median["marked"]
    result = {
        "config": cfg.as_dict(), "device": torch.cuda.get_device_name() if workload.device.type == "cuda" else "cpu",
        "steps_each": len(times["plain"]), "plain_median_ms": round(a, 3), "marked_median_ms": round(b, 3),
        "cost_pct": round((b / a - 1) * 100, 2), "modules": args.modules, "notes": notes.lines,
    }
    if "modules" in median:
        c = median["modules"]
        result.update({"modules_median_ms": round(c, 3), "modules_cost_pct": round((c / b - 1) * 100, 2),
                       "module_ranges_per_step": ranges,
                       "us_per_module_range": round((c - b) * 1000 / ranges, 2) if ranges else None})
    print(json.dumps(result))


if __name__ == "__main__":
    main()
