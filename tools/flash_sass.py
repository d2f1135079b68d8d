"""Compile one Triton or Gluon FlashAttention kernel config for sm_90 on any machine; report what ptxas made of it."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import triton

from profiler_kit.attention.machine_code import GLUON_KERNELS, TRITON_KERNELS, compile_sm90, machine_code
from profiler_kit.attention.options import GluonBackwardConfig, GluonForwardConfig

EPILOG = """Reports registers and spill bytes per thread, shared memory, instruction count, wgmma and exp2 instructions;
--sass writes the machine code. Triton kernels (fwd, dkdv, dq) take BLOCK_M,BLOCK_N,warps,stages[,flag...], e.g.
64,64,4,3,overlap; gluon-fwd takes BLOCK_N,STAGES,PINGPONG (e.g. 128,3,0); gluon-bwd STAGES,DEFER,BLOCK_M (e.g.
2,0,128). Use the Triton version of the GPU machine for figures that should match it: the machine code differs
between versions."""


def parse_config(kernel: str, text: str):
    """The config argument as `compile_sm90` takes it for `kernel`."""
    parts = text.split(",")
    if kernel == "gluon-fwd":
        block_n, stages, pingpong = map(int, parts)
        return GluonForwardConfig(block_n, stages, bool(pingpong))
    if kernel == "gluon-bwd":
        stages, defer, block_m = map(int, parts)
        return GluonBackwardConfig(stages, bool(defer), block_m)
    return (*map(int, parts[:4]), *parts[4:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, epilog=EPILOG)
    parser.add_argument("kernel", choices=[*TRITON_KERNELS, *GLUON_KERNELS])
    parser.add_argument("config", help="the kernel's config, comma-separated (see below)")
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--no-causal", dest="causal", action="store_false")
    parser.add_argument("--pointer", action="store_true", help="Triton kernels: pointer loads instead of TMA")
    parser.add_argument("--sass", type=Path, default=None, help="write the machine code here")
    args = parser.parse_args()
    try:
        compiled = compile_sm90(args.kernel, args.d, args.causal, parse_config(args.kernel, args.config),
                                tma=not args.pointer)
    except Exception as exc:  # noqa: BLE001 - a config that does not compile is an answer here
        print(f"{args.kernel} {args.config}: does not compile: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    usage, sass = machine_code(compiled)
    regs, stack = re.search(r"REG:(\d+)", usage).group(1), re.search(r"STACK:(\d+)", usage).group(1)
    instructions = re.findall(r"/\*[0-9a-f]{4}\*/\s+([^;]*);", sass)
    print(f"{args.kernel} {args.config} d={args.d} causal={args.causal} tma={not args.pointer} "
          f"(triton {triton.__version__}, sm_90): {regs} registers, {stack} bytes of stack (spills), "
          f"{compiled.metadata.shared} bytes of shared memory, {len(instructions)} instructions, "
          f"{sum('HGMMA' in i for i in instructions)} HGMMA, {sum('MUFU.EX2' in i for i in instructions)} MUFU.EX2")
    if args.sass:
        args.sass.write_text(sass)
    return 0


if __name__ == "__main__":
    sys.exit(main())
