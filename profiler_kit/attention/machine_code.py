"""The attention kernels compiled for sm_90 on any machine, GPU or not, and what ptxas made of them.

`compile_sm90` compiles one kernel in bf16 (the Triton kernels also with i32 integers, and in fp32) without
loading it, so that tests and `tools/flash_sass.py` can read its registers, spills and SASS without a GPU, either
as the launch layer runs it or as Inductor does under torch.compile; `machine_code` disassembles it with the tools
bundled with Triton.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import triton

from profiler_kit.attention.gluon_kernels import bwd as gluon_bwd
from profiler_kit.attention.gluon_kernels import fwd as gluon_fwd
from profiler_kit.attention.options import GluonBackwardConfig, GluonForwardConfig
from profiler_kit.attention.triton_kernels.bwd import KERNELS
from profiler_kit.attention.triton_kernels.configs import DESCRIPTOR_ROWS, block_d, configs, head_group

TRITON_KERNELS = tuple(KERNELS)
GLUON_KERNELS = ("gluon-fwd", "gluon-bwd")
# Argument kinds of the Triton kernels (they take their tensors first).
_FP32_ARGS = {"L", "LSE2", "Delta"}
_SCALARS = {"qk_scale", "sm_scale"}
_ROW_DESCRIPTORS = {"DESC_LSE2", "DESC_DELTA"}  # (Z·H, seq), over fp32 per-row statistics


def _compile_triton(kernel: str, shape: tuple, d: int, causal: bool, tma: bool, dtype: str,
                    traced: bool) -> triton.compiler.CompiledKernel:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = KERNELS[kernel].fn
    config = configs([shape], fn.arg_names)[0]
    width = block_d(d)
    consts = {**config.kwargs, "HEAD_DIM": d, "BLOCK_D": width, "CAUSAL": causal, "TMA": tma,
              "HEAD_GROUP": head_group(causal)}
    pointers = fn.arg_names[:fn.arg_names.index("DESC_Q")]
    signature = {}
    for name in fn.arg_names:
        if name in consts:
            signature[name] = "constexpr"
        elif name in DESCRIPTOR_ROWS:
            rows = consts[DESCRIPTOR_ROWS[name]]
            block = f"fp32[1,{rows}]" if name in _ROW_DESCRIPTORS else f"{dtype}[1,1,{rows},{width}]"
            signature[name] = f"tensordesc<{block}>" if tma else "constexpr"
        elif name in _SCALARS:
            # Triton's launcher passes Python floats as fp32; Inductor's code passes them as fp64.
            signature[name] = "fp64" if traced else "fp32"
        elif name in pointers:
            signature[name] = "*fp32" if name in _FP32_ARGS else f"*{dtype}"
        else:
            signature[name] = "i32"
    constexprs = {(fn.arg_names.index(n),): v for n, v in consts.items()}
    constexprs.update({(fn.arg_names.index(n),): None for n in DESCRIPTOR_ROWS if n in fn.arg_names and not tma})
    options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    if config.maxnreg:
        options["maxnreg"] = config.maxnreg
    return triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                          target=GPUTarget("cuda", 90, 32), options=options)


def compile_sm90(kernel: str, head_dim: int, causal: bool = True,
                 config: tuple | GluonForwardConfig | GluonBackwardConfig | None = None,
                 tma: bool = True, dtype: str = "bf16", traced: bool = False) -> triton.compiler.CompiledKernel:
    """Compile `kernel` for sm_90 and return the triton CompiledKernel, not loaded.

    `kernel` is one of TRITON_KERNELS ("fwd", "dkdv", "dq"), whose `config` is a (BLOCK_M, BLOCK_N, warps,
    stages, *flags) tuple (default: the first of its list), whose tensors are `dtype` ("bf16" or "fp32") and
    which move tiles by TMA when `tma`; `traced` compiles it as Inductor does for `Kernel.launch_traced` under
    torch.compile (pointer loads, float scalars in fp64). Or one of GLUON_KERNELS (bf16), whose `config` is a
    GluonForwardConfig / GluonBackwardConfig (default: the dataclass's).
    """
    if kernel in KERNELS:
        return _compile_triton(kernel, config or KERNELS[kernel].shapes[0], head_dim, causal, tma and not traced,
                               dtype, traced)
    if kernel == "gluon-fwd":
        return gluon_fwd.compile_kernel(head_dim, causal, config or GluonForwardConfig())
    if kernel == "gluon-bwd":
        return gluon_bwd.compile_kernel(head_dim, causal, config or GluonBackwardConfig())
    raise ValueError(f"unknown kernel {kernel!r}; choose from {', '.join((*TRITON_KERNELS, *GLUON_KERNELS))}")


def machine_code(compiled: triton.compiler.CompiledKernel) -> tuple[str, str]:
    """A compiled kernel's resource usage (`cuobjdump -res-usage`: registers, stack) and its SASS, from the
    tools bundled with Triton."""
    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        usage, sass = (subprocess.run([tools / "cuobjdump", flag, cubin.name], capture_output=True, text=True,
                                      check=True).stdout for flag in ("-res-usage", "-sass"))
    return usage, sass
