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
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from profiler_kit.attention.flash_triton import JIT_KERNELS as KERNELS
from profiler_kit.attention.flash_triton_launch import DESCRIPTOR_ROWS, configs

FP32_ARGS = {"L", "LSE2", "Delta"}
SCALARS = {"qk_scale", "sm_scale"}
ROW_DESCRIPTORS = {"DESC_LSE2", "DESC_DELTA"}  # (Z·H, seq), over fp32 per-row statistics


def compile_config(kernel: str, shape: tuple, d: int, causal: bool, tma: bool):
    fn = KERNELS[kernel]
    config = configs([shape], fn.arg_names)[0]
    consts = {**config.kwargs, "HEAD_DIM": d, "BLOCK_D": d, "CAUSAL": causal, "TMA": tma}
    pointers = fn.arg_names[:fn.arg_names.index("DESC_Q")]  # every kernel takes its tensors first
    signature = {}
    for name in fn.arg_names:
        if name in consts:
            signature[name] = "constexpr"
        elif name in DESCRIPTOR_ROWS:
            rows = consts[DESCRIPTOR_ROWS[name]]
            block = f"fp32[1,{rows}]" if name in ROW_DESCRIPTORS else f"bf16[1,1,{rows},{d}]"
            signature[name] = f"tensordesc<{block}>" if tma else "constexpr"
        elif name in SCALARS:
            signature[name] = "fp32"
        elif name in pointers:
            signature[name] = "*fp32" if name in FP32_ARGS else "*bf16"
        else:
            signature[name] = "i32"
    constexprs = {(fn.arg_names.index(n),): v for n, v in consts.items()}
    constexprs.update({(fn.arg_names.index(n),): None for n in DESCRIPTOR_ROWS if n in fn.arg_names and not tma})
    options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    if config.maxnreg:
        options["maxnreg"] = config.maxnreg
    return triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                          target=GPUTarget("cuda", 90, 32), options=options)


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
        compiled = compile_config(args.kernel, shape, args.d, args.causal, not args.pointer)
    except Exception as exc:  # noqa: BLE001 - a config that does not compile is an answer here
        print(f"{args.kernel} {args.config}: does not compile: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        usage = subprocess.run([tools / "cuobjdump", "-res-usage", cubin.name], capture_output=True, text=True,
                               check=True).stdout
        sass = subprocess.run([tools / "cuobjdump", "-sass", cubin.name], capture_output=True, text=True,
                              check=True).stdout
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
