"""Issue 6, step 20: how stable is one `attention bench` reading of a host-bound forward+backward?

For each shape, the implementations' forward+backward is timed as `attention bench` times it (`bench.bench_ms`,
i.e. do_bench with the L2 flush), in --rounds rounds whose implementation order alternates, once with Python's
garbage collector on (as the bench runs) and once with it off during the timing (as `timeit` does). One line
per shape, mode and implementation: the median of each round, in ms.

Usage (GPU machine, repository root): python3 scripts/step20/host_rounds.py [--impl flash-triton,sdpa-flash]
    [--shapes 64x256,16x256,16x4096,64x4096] [--rounds 6]   (shapes d×N; batch 8, no heads, bf16, causal)
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys

import torch

from profiler_kit.attention.bench import bench_ms, make_impl


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", default="flash-triton,sdpa-flash")
    parser.add_argument("--shapes", default="64x256,16x256,16x4096,64x4096")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    device = torch.device("cuda")
    names = args.impl.split(",")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; batch 8, bf16, causal; fwd+bwd ms, "
          f"median of each round (do_bench, warmup 25 ms, rep 100 ms)")
    for shape in args.shapes.split(","):
        d, n = map(int, shape.split("x"))
        q, k, v, grad_out = (torch.randn(8, n, d, device=device, dtype=torch.bfloat16) for _ in range(4))
        leaves = [t.requires_grad_() for t in (q, k, v)]
        fns = {name: make_impl(name, True, device) for name in names}
        for fn in fns.values():
            for _ in range(2):  # compile, autotune, register the C++ plan, then take it once
                fn(*leaves).backward(grad_out)
        for collector in ("gc on", "gc off"):
            rounds: dict[str, list[float]] = {name: [] for name in names}
            for r in range(args.rounds):
                for name in names if r % 2 == 0 else names[::-1]:
                    fn = fns[name]
                    gc.collect()
                    if collector == "gc off":
                        gc.disable()
                    try:
                        call = lambda fn=fn, args=leaves, grad=grad_out: fn(*args).backward(grad)  # noqa: E731
                        timing = bench_ms(call, device, 25, 100, leaves)
                    finally:
                        gc.enable()
                    rounds[name].append(timing.median_ms)
            for name, values in rounds.items():
                print(f"d={d} N={n} {collector:6} {name:13} median {statistics.median(values):.3f}  rounds "
                      + " ".join(f"{x:.3f}" for x in values))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
