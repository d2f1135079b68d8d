"""Record one workload step for test fixtures: under nsys (cudaProfilerApi capture range around the timed
steps), under torch.profiler (Chrome trace), or with CUDA memory history (snapshot pickle).

Used by scripts/gpu_record_fixtures.sh on the GPU machine; the fixtures it makes live in tests/fixtures/.
"""

import argparse
import pickle

import torch

from profiler_kit.nvtx_ranges import set_record_function
from profiler_kit.workload import Workload, WorkloadConfig, synchronize

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="tiny")
parser.add_argument("--ctx", type=int, default=128)
parser.add_argument("--mode", default="train")
parser.add_argument("--mixed-precision", action="store_true")
parser.add_argument("--warmup", type=int, default=2)
parser.add_argument("--steps", type=int, default=1)
parser.add_argument("--kind", choices=["nsys", "torch", "memory"], required=True)
parser.add_argument("--out", default=None)
args = parser.parse_args()

workload = Workload(WorkloadConfig(args.model, args.ctx, args.mode, mixed_precision=args.mixed_precision))
for _ in range(args.warmup):
    workload.step()
synchronize(workload.device)
if args.kind == "nsys":
    torch.cuda.profiler.start()
    for _ in range(args.steps):
        workload.step()
    synchronize(workload.device)
    torch.cuda.profiler.stop()
elif args.kind == "torch":
    set_record_function(True)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(args.steps):
            workload.step()
        synchronize(workload.device)
    prof.export_chrome_trace(args.out)
else:
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    for _ in range(args.steps):
        workload.step()
    synchronize(workload.device)
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    with open(args.out, "wb") as fh:
        pickle.dump(snapshot, fh, protocol=4)
