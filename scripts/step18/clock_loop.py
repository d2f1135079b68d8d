"""Issue 6, step 18: SM clock and power while the leaderboard backward runs back to back, Triton's dK/dV kernel
against the warp-specialised one (`.gpu/s18/dkdv_ws.py`, 3 stages). Each backward runs for --seconds in a loop,
twice, alternating; `nvidia-smi` is sampled every 50 ms meanwhile. One row per loop: ms per call (CUDA events
around the loop), mean SM clock (MHz) and power (W) over the loop's samples.

Step 19: `--impl flash-triton,sdpa-cudnn` loops the forward+backward of `attention bench`'s implementations
instead (as bench times it, without the L2 flush), on the leaderboard shape.

Usage (GPU machine, repository root): python3 scripts/step18/clock_loop.py [--seconds 3] [--impl A,B]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from flash_fused_sink import load_variant  # noqa: E402
from run_ws import inputs, run  # noqa: E402

from profiler_kit.attention import flash_triton_bwd  # noqa: E402
from profiler_kit.attention.bench import make_impl  # noqa: E402


def fwd_bwd(names: list[str]) -> dict:
    """Each implementation's forward+backward on the leaderboard shape (bf16, causal), as a callable."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(1, 16, 16384, 64, device="cuda", dtype=torch.bfloat16, generator=gen)
                   for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    def call(f) -> None:
        q.grad = k.grad = v.grad = None  # as do_bench's grad_to_none: no accumulation kernels
        f(q, k, v).backward(do)

    return {name: functools.partial(call, make_impl(name, True, torch.device("cuda"))) for name in names}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--impl", default=None, help="forward+backward of these bench implementations instead")
    args = parser.parse_args()
    if args.impl:
        fns, what = fwd_bwd(args.impl.split(",")), "leaderboard forward+backward"
    else:
        ws = load_variant(Path(".gpu/s18/dkdv_ws.py").read_text(), "dkdv_ws_clock", Path(tempfile.mkdtemp()))
        case = inputs(1, 16, 16384, True, seed=0)
        fns = {"triton": functools.partial(flash_triton_bwd.flash_backward, *case),
               "ws s3": functools.partial(run, ws, *case, 3)}
        what = "leaderboard backward"
    samples: list[tuple[float, float, float]] = []
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                            "-lms", "50"], stdout=subprocess.PIPE, text=True)

    def read() -> None:
        for line in smi.stdout:
            try:
                clock, power = (float(x) for x in line.split(","))
            except ValueError:
                continue
            samples.append((time.time(), clock, power))

    threading.Thread(target=read, daemon=True).start()
    for fn in fns.values():  # compile and warm up
        fn()
    torch.cuda.synchronize()
    print(f"# step18/clock_loop: {torch.cuda.get_device_name()}, {what}, {args.seconds} s loops\n")
    print("| call | loop | ms per call | mean SM clock MHz | mean power W | samples |")
    print("|---|---:|---:|---:|---:|---:|")
    for loop in range(2):
        for label, fn in fns.items():
            time.sleep(1.0)  # let the clock recover between loops
            start_event, end_event = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.time()
            start_event.record()
            calls = 0
            while time.time() - t0 < args.seconds:
                fn()
                calls += 1
            end_event.record()
            torch.cuda.synchronize()
            t1 = time.time()
            window = [s for s in samples if t0 + 0.2 <= s[0] <= t1]
            print(f"| {label} | {loop + 1} | {start_event.elapsed_time(end_event) / calls:.3f} | "
                  f"{statistics.mean(s[1] for s in window):.0f} | {statistics.mean(s[2] for s in window):.0f} | "
                  f"{len(window)} |", flush=True)
    smi.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
