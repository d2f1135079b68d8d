"""Time the whole backward with the Gluon kernels against the Triton one on the issue 6 shapes (steps 16, 17).

For each shape: the forward once, then rounds that alternate the Triton backward (autotuned, as shipped), the
backward with each Gluon dK/dV config (`flash_backward(..., gluon_dkdv=...)`; D pre-pass and dQ kernel
unchanged), with each fused Gluon config (`gluon_fused=...`, d = 64: dK, dV and dQ in one kernel) and cuDNN's
SDPA backward on the same inputs, each timed by `triton.testing.do_bench` (median ms). Every result is also
checked against the Triton one (largest difference over the largest magnitude, over dQ, dK and dV). Then one
profiled call of each gives the kernels' own GPU times.

Usage (GPU machine): python3 scripts/flash_gluon_dkdv.py [--shapes leaderboard,causal4096,full8192]
    [--rounds 3] [--no-dkdv] [--output F.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time

import torch
import triton
from flash_tune import write_rows  # scripts/ is on sys.path when a script runs

from profiler_kit.attention.flash_triton_bwd import flash_backward
from profiler_kit.attention.flash_triton_fwd import flash_forward

# name: (Z, H, N, d, causal), bf16, as in scripts/flash_tune.py.
SHAPES = {
    "leaderboard": (1, 16, 16384, 64, True),
    "causal4096": (4, 16, 4096, 128, True),
    "full8192": (4, 16, 8192, 128, False),
}
# (block_m, block_n, stages, warps) per head dim; every one compiled without spills for sm_90 (Triton 3.6).
CONFIGS = {
    64: [(64, 64, 3, 4), (64, 64, 2, 4), (64, 64, 4, 4), (64, 128, 3, 8), (64, 128, 2, 8)],
    128: [(32, 64, 3, 4), (32, 64, 4, 4), (64, 64, 2, 4), (32, 128, 3, 8)],
}
# The fused kernel's configs (d = 64 only, flash_gluon_bwd.FUSED_HEAD_DIMS): 244-246 registers, no spills.
FUSED_CONFIGS = {64: [(64, 64, 2, 4), (64, 64, 3, 4), (64, 64, 4, 4)], 128: []}


def gluon_kwargs(config: tuple) -> dict:
    block_m, block_n, stages, warps = config
    return {"block_m": block_m, "block_n": block_n, "stages": stages, "num_warps": warps}


def kernel_times_ms(fn, calls: int = 5) -> dict[str, float]:
    """Mean GPU time per call of each kernel `fn` launches, from torch.profiler."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return {e.key: e.device_time_total / calls / 1e3 for e in prof.key_averages() if e.device_time_total > 0}


def max_rel_diff(got, reference) -> float:
    """Largest difference over the largest magnitude, over the tensors of two results (dQ, dK, dV)."""
    return max(((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
               for a, b in zip(got, reference, strict=True))


def time_rounds(fns: dict, rounds: int) -> dict[str, dict[str, float]]:
    """do_bench each callable once per round, the callables interleaved; median, min and max ms per label."""
    times: dict[str, list[float]] = {label: [] for label in fns}
    for _ in range(rounds):
        for label, fn in fns.items():
            times[label].append(triton.testing.do_bench(fn, warmup=25, rep=100))
    return {label: {"bwd_ms": statistics.median(t), "bwd_ms_min": min(t), "bwd_ms_max": max(t)}
            for label, t in times.items()}


def cudnn_backward(q, k, v, do, causal: bool):
    """dQ, dK, dV of cuDNN's SDPA on the same inputs, the forward recorded once (what its backward costs)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal)
    return lambda: torch.autograd.grad(out, leaves, do, retain_graph=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-dkdv", action="store_true", help="leave out the Gluon dK/dV configs")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    rows = []
    for name in args.shapes.split(","):
        z, h, n, d, causal = SHAPES[name]
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = (torch.randn(z, h, n, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
        out, lse = flash_forward(q, k, v, causal)
        fns = {"triton": functools.partial(flash_backward, q, k, v, out, lse, do, causal)}
        for c in [] if args.no_dkdv else CONFIGS[d]:
            fns[f"gluon {c}"] = functools.partial(flash_backward, q, k, v, out, lse, do, causal,
                                                  gluon_dkdv=gluon_kwargs(c))
        for c in FUSED_CONFIGS[d]:
            fns[f"fused {c}"] = functools.partial(flash_backward, q, k, v, out, lse, do, causal,
                                                  gluon_fused=gluon_kwargs(c))
        fns["sdpa-cudnn"] = cudnn_backward(q, k, v, do, causal)
        reference = fns["triton"]()
        errors = {}
        for label, fn in fns.items():
            try:
                errors[label] = max_rel_diff(fn(), reference)
            except Exception as exc:  # noqa: BLE001 - a config that fails is a result here
                errors[label] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        times = time_rounds({label: fn for label, fn in fns.items() if not isinstance(errors[label], str)},
                            args.rounds)
        for label in fns:
            row = {"shape": name, "variant": label, "error": errors[label] if isinstance(errors[label], str) else None,
                   "max_rel_diff_vs_triton": None if isinstance(errors[label], str) else errors[label]}
            if label in times:
                row.update(**times[label], kernels_ms=kernel_times_ms(fns[label]))
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
        del fns, reference
        torch.cuda.empty_cache()

    device = torch.cuda.get_device_name()
    print(f"# flash_gluon_dkdv: {device}, torch {torch.__version__}, triton {triton.__version__}, "
          f"{time.strftime('%Y-%m-%d')}\n")
    print("| shape | backward | ms (median of rounds) | [min, max] | dK/dV (or fused) kernel ms | vs triton "
          "| max rel diff |")
    print("|---|---|---:|---|---:|---:|---:|")
    for r in rows:
        if r["error"]:
            print(f"| {r['shape']} | {r['variant']} | – | | | | {r['error']} |")
            continue
        base = next(x for x in rows if x["shape"] == r["shape"] and x["variant"] == "triton")
        dkdv = sum(ms for key, ms in r["kernels_ms"].items() if "dkdv" in key or "fused" in key)
        print(f"| {r['shape']} | {r['variant']} | {r['bwd_ms']:.3f} | [{r['bwd_ms_min']:.3f}, {r['bwd_ms_max']:.3f}] "
              f"| {dkdv:.3f} | {base['bwd_ms'] / r['bwd_ms']:.3f}× | {r['max_rel_diff_vs_triton']:.1e} |")
    if args.output:
        write_rows(args.output, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
