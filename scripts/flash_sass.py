"""Compile one Triton FlashAttention kernel config for sm_90 on any machine (no GPU needed) and report what
ptxas made of it: registers and spill bytes per thread, shared memory, instruction count, wgmma and exp2
instructions; --sass writes the machine code. This is how step 11 of docs/results/attention-h100.md read
the order of the wgmma and MUFU.EX2 instructions before timing anything. Use the Triton version of the GPU
machine (3.6 there) for figures that should match it: the machine code differs between versions.

Usage: python3 scripts/flash_sass.py dkdv 64,64,4,3,overlap [--d 64] [--no-causal] [--pointer] [--sass F]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import triton

from profiler_kit.attention.flash_triton import JIT_KERNELS as KERNELS
from profiler_kit.attention.flash_triton import compile_sm90, machine_code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernel", choices=sorted(KERNELS))
    parser.add_argument("config", help="BLOCK_M,BLOCK_N,warps,stages[,flag...], e.g. 64,64,4,3,overlap")
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--no-causal", dest="causal", action="store_false")
    parser.add_argument("--pointer", action="store_true", help="pointer loads instead of TMA descriptors")
    parser.add_argument("--sass", type=Path, default=None, help="write the machine code here")
    args = parser.parse_args()
    parts = args.config.split(",")
    shape = (*map(int, parts[:4]), *parts[4:])
    try:
        compiled = compile_sm90(args.kernel, shape, args.d, args.causal, not args.pointer)
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
