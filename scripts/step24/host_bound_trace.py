"""The seeds' grid's forward+backward timed as `attention bench` times it, under Nsight Systems, to see where a
host-bound call's time goes (issue 6, step 24).

For each implementation, one NVTX range around do_bench's forward+backward samples (`bench.sample_ms`, the bench's
own timing: gradients reset, the L2 flush, CUDA events) on (batch, seq, d) inputs, bf16, causal. The medians are
printed; `scripts/step24/trace_gaps.py` reads the SQLite export and splits each timed call into host and GPU parts.

Usage (GPU machine): $NSYS profile -t cuda,nvtx,osrt -o trace --export sqlite \
    python3 scripts/step24/host_bound_trace.py [--impl flash-triton,sdpa-flash --batch 8 --seq 4096 --d 64]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from profiler_kit import nvtx_ranges
from profiler_kit.attention.bench import make_impl, sample_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", default="flash-triton,sdpa-flash")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--rep-ms", type=float, default=100.0)
    args = parser.parse_args()
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    q, k, v, grad_out = (torch.randn(args.batch, args.seq, args.d, dtype=torch.bfloat16, device=dev, generator=gen)
                         for _ in range(4))
    params = [t.requires_grad_() for t in (q, k, v)]
    for name in args.impl.split(","):
        fn = make_impl(name, True, dev)
        for _ in range(3):  # compiles, autotunes and (C++ host path) registers the layout
            fn(q, k, v).backward(grad_out)
        torch.cuda.synchronize()
        with nvtx_ranges.nvtx_range(name):
            ms = sample_ms(lambda fn=fn: fn(q, k, v).backward(grad_out), dev, 25.0, args.rep_ms, params)
        torch.cuda.synchronize()
        print(f"{name}: fwd+bwd median {statistics.median(ms):.3f} ms over {len(ms)} calls", flush=True)


if __name__ == "__main__":
    main()
