"""GPU timeline of one attention forward+backward as `attention bench` times it: where the GPU idles.

Each of `--iterations` calls runs as do_bench runs it (gradients reset, the 256 MB L2 flush, then the call)
under torch.profiler, with a synchronize and a pause between calls so that every call is an island on the
GPU timeline. For each implementation the script prints the kernels of the median call in order: start after
the flush ends, duration, and the idle gap before each, and a summary line per implementation: the span from
the flush's end to the last kernel's end (what do_bench's events measure), the kernel time within it, and
the idle time. Medians over the calls, in µs.

`--back-to-back` leaves out the synchronize and the pause, as do_bench's loop does: where the host is slower
than the GPU, the idle gaps then show where the GPU waits for it. Calls are split at the flushes (the kernel
the first call starts with). `--heads 0` gives (batch, seq, d) inputs, as the seeds' grid uses.

Usage (GPU machine): python3 scripts/flash_timeline.py [--impl flash-triton,sdpa-cudnn] [--iterations 9]
    [--batch 1 --heads 16 --seq 16384 --d 64] [--back-to-back]   (defaults: the leaderboard config, bf16, causal)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity, profile

from profiler_kit.attention.bench import make_impl

# A gap this long between kernels separates two calls (the script pauses 2 ms between them).
CALL_SEPARATION_US = 1000.0


def kernels_of(trace_path: str) -> list[dict]:
    """The GPU kernels and memsets of a torch.profiler Chrome trace, in start order."""
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memset")]
    return sorted(({"name": e["name"], "start": e["ts"], "dur": e["dur"]} for e in gpu), key=lambda k: k["start"])


def calls_of(kernels: list[dict], back_to_back: bool = False) -> list[list[dict]]:
    """Split the timeline into calls, each starting with its flush: at gaps longer than CALL_SEPARATION_US, or
    with `back_to_back` at each kernel named as the first one (the flush) that takes at least half as long."""
    calls, current, end = [], [], None
    flush = kernels[0]
    for k in kernels:
        if back_to_back:
            starts_call = k["name"] == flush["name"] and k["dur"] >= flush["dur"] / 2
        else:
            starts_call = end is not None and k["start"] - end > CALL_SEPARATION_US
        if starts_call and current:
            calls.append(current)
            current = []
        current.append(k)
        end = max(end or 0.0, k["start"] + k["dur"])
    return calls + [current] if current else calls


def summary(call: list[dict]) -> dict:
    """Span after the flush (the first kernel), kernel time and idle time in it, in µs."""
    flush, rest = call[0], call[1:]
    origin = flush["start"] + flush["dur"]
    span = max(k["start"] + k["dur"] for k in rest) - origin
    busy = sum(k["dur"] for k in rest)
    return {"span_us": span, "kernel_us": busy, "idle_us": span - busy}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", default="flash-triton,sdpa-cudnn")
    parser.add_argument("--iterations", type=int, default=9)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq", type=int, default=16384)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--back-to-back", action="store_true", help="no synchronize or pause between calls")
    args = parser.parse_args(argv)

    device = torch.device("cuda")
    shape = (args.batch, args.heads, args.seq, args.d) if args.heads else (args.batch, args.seq, args.d)
    q, k, v, grad_out = (torch.randn(shape, device=device, dtype=torch.bfloat16) for _ in range(4))
    leaves = [t.requires_grad_() for t in (q, k, v)]
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device=device)  # do_bench's L2 flush buffer
    mode = "back to back" if args.back_to_back else "one at a time"
    print(f"bf16 causal {shape} on {torch.cuda.get_device_name()}, calls {mode}; medians over "
          f"{args.iterations} calls, µs")
    for name in args.impl.split(","):
        fn = make_impl(name, True, device)
        fn(*leaves).backward(grad_out)  # compile and autotune outside the trace
        torch.cuda.synchronize()
        # Back to back, the host's own time is what is measured: CPU op recording would add to it.
        activities = [ProfilerActivity.CUDA] if args.back_to_back else [ProfilerActivity.CPU, ProfilerActivity.CUDA]
        with profile(activities=activities) as prof:
            for _ in range(args.iterations):
                for t in leaves:
                    t.grad = None
                flush.zero_()
                fn(*leaves).backward(grad_out)
                if not args.back_to_back:
                    torch.cuda.synchronize()
                    time.sleep(0.002)
            torch.cuda.synchronize()
        with tempfile.NamedTemporaryFile(suffix=".json") as trace:
            prof.export_chrome_trace(trace.name)
            calls = calls_of(kernels_of(trace.name), args.back_to_back)
        stats = [summary(c) for c in calls]
        spans = [s["span_us"] for s in stats]
        median_call = calls[spans.index(sorted(spans)[len(spans) // 2])]
        origin = median_call[0]["start"] + median_call[0]["dur"]
        print(f"\n{name}: {len(calls)} calls; span {statistics.median(spans):.1f}, kernels "
              f"{statistics.median(s['kernel_us'] for s in stats):.1f}, idle "
              f"{statistics.median(s['idle_us'] for s in stats):.1f}")
        end = origin
        for kernel in median_call[1:]:
            print(f"  start {kernel['start'] - origin:9.1f}  dur {kernel['dur']:9.1f}  "
                  f"gap {kernel['start'] - end:8.1f}  {kernel['name'][:90]}")
            end = max(end, kernel["start"] + kernel["dur"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
