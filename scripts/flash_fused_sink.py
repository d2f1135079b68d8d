"""Where the fused Gluon backward's time goes: its dQ tile sent three ways (issue 6, step 17).

The fused kernel (`flash_gluon_bwd.fused`) is rebuilt from its source with the TMA reduction of each dQ tile
replaced: by a plain TMA store to the same addresses (wrong result, same traffic without the read-modify-write
in L2), or by nothing (the tile still goes through shared memory). The whole backward and the fused kernel's
own time are measured for each, as `flash_gluon_dkdv.py` does, beside the Triton backward and cuDNN's.
`--module` adds other versions of the kernel's module (a file path each).

Usage (GPU machine): python3 scripts/flash_fused_sink.py [--config 64,64,3,4] [--module F.py ...] [--output F.json]
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import re
import sys
import tempfile
from pathlib import Path

import torch
import triton
from flash_gluon_dkdv import SHAPES, cudnn_backward, gluon_kwargs, kernel_times_ms, max_rel_diff, time_rounds
from flash_tune import write_rows

from profiler_kit.attention import flash_gluon_bwd, flash_triton_bwd
from profiler_kit.attention.flash_triton_fwd import flash_forward

REDUCTION = re.compile(r"tma_reduce_add\((desc_dq, \[[^\]]*\], dq_s)\)")
SINKS = {
    "reduce (as written)": None,
    "plain TMA store": r"tma.async_copy_shared_to_global(\1)",
    "no write (shared memory only)": "pass",
}


def load_variant(source: str, name: str, workdir: Path):
    """Import `source` as a module of its own (Gluon reads a kernel's source from its file)."""
    path = workdir / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def backward_with(module, q, k, v, out, lse, do, causal: bool, **gluon):
    """The backward with `module` (a version of flash_gluon_bwd) standing in for the library's Gluon kernels, and
    `gluon` passed on to flash_backward (gluon_dkdv=... or gluon_fused=...); the library's module is put back."""
    flash_triton_bwd.flash_gluon_bwd = module
    try:
        return flash_triton_bwd.flash_backward(q, k, v, out, lse, do, causal, **gluon)
    finally:
        flash_triton_bwd.flash_gluon_bwd = flash_gluon_bwd


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="64,64,3,4", help="block_m,block_n,stages,warps")
    parser.add_argument("--module", action="append", default=[], help="another version of flash_gluon_bwd.py")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    config = gluon_kwargs(tuple(int(x) for x in args.config.split(",")))
    z, h, n, d, causal = SHAPES["leaderboard"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(z, h, n, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
    out, lse = flash_forward(q, k, v, causal)
    workdir = Path(tempfile.mkdtemp())
    modules = {}
    for label, replacement in SINKS.items():
        source = Path(flash_gluon_bwd.__file__).read_text()
        if replacement is not None:
            source, count = REDUCTION.subn(replacement, source)
            assert count == 2, count
        modules[label] = load_variant(source, f"fused_sink_{len(modules)}", workdir)
    for path in args.module:
        source = Path(path).read_text()
        modules[f"module {Path(path).name}"] = load_variant(source, f"fused_alt_{len(modules)}", workdir)

    fns = {"triton": functools.partial(flash_triton_bwd.flash_backward, q, k, v, out, lse, do, causal),
           **{label: functools.partial(backward_with, m, q, k, v, out, lse, do, causal, gluon_fused=config)
              for label, m in modules.items()},
           "sdpa-cudnn": cudnn_backward(q, k, v, do, causal)}
    reference = fns["triton"]()
    rows = []
    times = time_rounds(fns, args.rounds)
    for label, fn in fns.items():
        rows.append({"variant": label, "config": args.config, **times[label],
                     "max_rel_diff_vs_triton": max_rel_diff(fn(), reference), "kernels_ms": kernel_times_ms(fn)})
        print(json.dumps(rows[-1]), file=sys.stderr)

    print(f"# flash_fused_sink: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
          f"{triton.__version__}, leaderboard shape, config {args.config}\n")
    print("| backward | ms (median of rounds) | [min, max] | fused (or dK/dV + dQ) kernels ms | max rel diff |")
    print("|---|---:|---|---:|---:|")
    for r in rows:
        kernels = sum(ms for key, ms in r["kernels_ms"].items() if any(s in key for s in ("fused", "dkdv", "_dq_")))
        print(f"| {r['variant']} | {r['bwd_ms']:.3f} | [{r['bwd_ms_min']:.3f}, {r['bwd_ms_max']:.3f}] | "
              f"{kernels:.3f} | {r['max_rel_diff_vs_triton']:.1e} |")
    if args.output:
        write_rows(args.output, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
