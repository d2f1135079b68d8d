"""Run training steps of one workload under a recorder (nsys capture range, torch.profiler, memory history).

The fixtures in tests/fixtures/ come from this program (tools/record_fixtures.sh runs it on a GPU machine).
It calls torch's recording APIs directly, as any user program would, so the fixtures also test that
profiler-kit reads reports that it did not write itself. Run it with the project's python from the repository
root (on a machine without the installed package: PYTHONPATH=$PWD).
"""

from __future__ import annotations

import argparse
import pickle

import torch

from profiler_kit.device import synchronize
from profiler_kit.nvtx_ranges import set_record_function
from profiler_kit.presets import PRESETS
from profiler_kit.workload import MODES, Workload, WorkloadConfig

MEMORY_HISTORY_ENTRIES = 100_000


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--kind",
        choices=["nsys", "torch", "memory"],
        required=True,
        help="nsys: open a cudaProfilerApi capture range around the recorded steps (run under "
        "`nsys profile --capture-range=cudaProfilerApi`); torch: write a torch.profiler Chrome trace to --out; "
        "memory: write a CUDA memory snapshot (pickle) to --out.",
    )
    parser.add_argument("--model", default="tiny", choices=sorted(PRESETS), help="model preset (default: tiny)")
    parser.add_argument("--ctx", type=int, default=128, help="context length (default: 128)")
    parser.add_argument("--mode", default="train", choices=MODES, help="default: train")
    parser.add_argument("--mixed-precision", action="store_true", help="bf16 autocast")
    parser.add_argument("--warmup", type=int, default=2, help="unrecorded steps first (default: 2)")
    parser.add_argument("--steps", type=int, default=1, help="recorded steps (default: 1)")
    parser.add_argument("--out", default=None, help="output file of --kind torch and memory")
    args = parser.parse_args()
    if args.kind != "nsys" and args.out is None:
        parser.error(f"--kind {args.kind} needs --out")
    return args


def run_steps(workload: Workload, steps: int) -> None:
    for _ in range(steps):
        workload.step()
    synchronize(workload.device)


def main() -> None:
    args = parse_args()
    workload = Workload(WorkloadConfig(args.model, args.ctx, args.mode, mixed_precision=args.mixed_precision))
    run_steps(workload, args.warmup)
    if args.kind == "nsys":
        torch.cuda.profiler.start()
        run_steps(workload, args.steps)
        torch.cuda.profiler.stop()
    elif args.kind == "torch":
        set_record_function(True)
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as prof:
            run_steps(workload, args.steps)
        prof.export_chrome_trace(args.out)
    else:
        torch.cuda.memory._record_memory_history(max_entries=MEMORY_HISTORY_ENTRIES)
        run_steps(workload, args.steps)
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        with open(args.out, "wb") as fh:
            pickle.dump(snapshot, fh, protocol=4)


if __name__ == "__main__":
    main()
