"""Issue 6, step 18: the warp-specialised dK/dV kernels (.gpu/s18/dkdv_ws*.py, built by make_variants.sh) in
place of `flash_gluon_bwd.dkdv`. Each is checked against the Triton backward on three d = 64 shapes, then the
whole backward is timed on the leaderboard shape beside the Triton one, the committed Gluon dK/dV kernel and
cuDNN's (do_bench medians of 3 rounds; kernel times from torch.profiler). `--variant NAME=PATH` runs other
versions of the module instead (step 19: K and V in registers, .gpu/s19/dkdv_regs.py).

Usage (GPU machine, repository root): python3 scripts/step18/run_ws.py [--variant NAME=PATH ...] [--output F.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flash_fused_sink import backward_with, load_variant  # noqa: E402
from flash_gluon_dkdv import cudnn_backward, kernel_times_ms, max_rel_diff, time_rounds  # noqa: E402

from profiler_kit.attention import flash_gluon_bwd, flash_triton_bwd  # noqa: E402
from profiler_kit.attention.flash_triton_fwd import flash_forward  # noqa: E402

CHECKS = [(1, 3, 1000, True), (2, 2, 777, False), (1, 16, 16384, True)]  # (Z, H, N, causal), d = 64
STAGES = (3, 4)


def run(module, q, k, v, out, lse, do, causal, stages):
    """The backward with `module` standing in for flash_gluon_bwd (its `dkdv` is the variant's kernel)."""
    return backward_with(module, q, k, v, out, lse, do, causal,
                         gluon_dkdv=dict(block_m=64, block_n=64, stages=stages, num_warps=4))


def inputs(z, h, n, causal, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(z, h, n, 64, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
    out, lse = flash_forward(q, k, v, causal)
    return q, k, v, out, lse, do, causal


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME=PATH of a flash_gluon_bwd version (default: step 18's ws and ws_pp)")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp())
    paths = dict(v.split("=", 1) for v in args.variant) or {n: f".gpu/s18/dkdv_{n}.py" for n in ("ws", "ws_pp")}
    variants = {name: load_variant(Path(path).read_text(), f"dkdv_{name}_variant", workdir)
                for name, path in paths.items()}
    rows = []
    for z, h, n, causal in CHECKS:
        case = inputs(z, h, n, causal, seed=1)
        reference = flash_triton_bwd.flash_backward(*case)
        for name, module in variants.items():
            for stages in STAGES:
                got = run(module, *case, stages)
                rows.append({"check": name, "stages": stages, "shape": [z, h, n, 64, causal],
                             "max_rel_diff_vs_triton": max_rel_diff(got, reference),
                             "dk_dv_bitwise_equal": bool(torch.equal(got[1], reference[1])
                                                         and torch.equal(got[2], reference[2]))})
                print(json.dumps(rows[-1]), flush=True)
    case = inputs(1, 16, 16384, True, seed=0)
    fns = {"triton": functools.partial(flash_triton_bwd.flash_backward, *case),
           "gluon dkdv s3 (committed)": functools.partial(run, flash_gluon_bwd, *case, 3),
           **{f"{name} s{s}": functools.partial(run, m, *case, s) for name, m in variants.items() for s in STAGES},
           "sdpa-cudnn": cudnn_backward(case[0], case[1], case[2], case[5], True)}
    times = time_rounds(fns, 3)
    print(f"\n# step18/run_ws ({', '.join(paths)}): {torch.cuda.get_device_name()}, leaderboard shape, bf16\n")
    print("| backward | ms, median [min, max] | dK/dV kernel ms | dQ kernel ms |\n|---|---|---:|---:|")
    for label, fn in fns.items():
        kernels = kernel_times_ms(fn)
        rows.append({"variant": label, **times[label], "kernels_ms": kernels})
        dkdv = sum(ms for key, ms in kernels.items() if "dkdv" in key or "flash_bprop" in key)
        dq = sum(ms for key, ms in kernels.items() if "_dq_" in key)
        print(f"| {label} | {times[label]['bwd_ms']:.3f} [{times[label]['bwd_ms_min']:.3f}, "
              f"{times[label]['bwd_ms_max']:.3f}] | {dkdv:.3f} | {dq:.3f} |")
    if args.output:
        Path(args.output).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
