"""FlashAttention-2 in Triton as an autograd Function, and `flash_attention`, the public entry point.

Layers: the @triton.jit kernels and their launchers live in `flash_triton_fwd` / `flash_triton_bwd`, the launch
plumbing both share in `flash_triton_launch`; this module checks the inputs, folds the leading dims and wires
forward and backward together.
"""

from __future__ import annotations

import torch
import triton

from profiler_kit.attention import flash_cpp, flash_gluon_bwd, flash_triton_bwd, flash_triton_fwd
from profiler_kit.attention.flash_torch import (
    AttentionInputError,
    FlashAttentionPytorch,
    check_attention_inputs,
)
from profiler_kit.attention.flash_triton_bwd import flash_backward
from profiler_kit.attention.flash_triton_fwd import as_4d, flash_forward
from profiler_kit.attention.flash_triton_launch import CONFIG_FLAGS, DESCRIPTOR_ROWS, INTERPRET, configs, head_group


def _check_triton_device(q: torch.Tensor) -> None:
    if q.device.type != "cuda" and not INTERPRET:
        raise AttentionInputError(
            f"FlashAttentionTriton needs CUDA tensors, got {q.device} "
            "(set TRITON_INTERPRET=1 before importing profiler_kit to run the kernels on the CPU interpreter)"
        )
    if INTERPRET and q.dtype == torch.bfloat16:
        # The interpreter stores bf16 as raw uint16 and tl.dot multiplies the bit patterns (triton#11584).
        raise AttentionInputError("the Triton interpreter cannot compute bfloat16; use fp16/fp32 or a GPU")


class FlashAttentionTriton(torch.autograd.Function):
    """FlashAttention-2 forward and backward in Triton. Saves exactly q, k, v, o and the fp32 logsumexp.

    Same contract as FlashAttentionPytorch (see `flash_torch`): `(..., seq, d)` inputs, head dims 16–128,
    fp32/bf16/fp16, different query and key lengths, causal masking aligned to the top left. fp32 runs its
    matmuls in TF32.
    """

    @staticmethod
    def forward(
        ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False
    ) -> torch.Tensor:
        check_attention_inputs(q, k, v)
        _check_triton_device(q)
        out, lse = flash_forward(as_4d(q), as_4d(k), as_4d(v), is_causal)
        out, lse = out.view(q.shape), lse.view(q.shape[:-1])
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal = is_causal
        ctx.cpp_forward = flash_triton_fwd.last_cpp_specs() if flash_cpp.ENABLED else None
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        if ctx.cpp_forward is not None:
            grad_out = grad_out.contiguous()  # as the C++ backward makes it, so that its plan fits
        dq, dk, dv = flash_backward(as_4d(q), as_4d(k), as_4d(v), as_4d(out), lse, grad_out, ctx.is_causal)
        if ctx.cpp_forward is not None and q.numel():
            # Later calls with this layout take the C++ path (see flash_cpp).
            stat_shape = (q.numel() // (q.shape[-2] * q.shape[-1]), flash_triton_bwd.stat_rows(q.shape[-2]))
            flash_cpp.register(q, k, v, ctx.is_causal, grad_out,
                               {**ctx.cpp_forward, **flash_triton_bwd.last_cpp_specs()}, stat_shape)
        return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape), None


def triton_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """The Triton kernels over `(..., seq, d)` tensors: `FlashAttentionTriton`, or on CUDA with
    PROFILER_KIT_FLASH_CPP=1 the C++ host path once this input layout has run a forward+backward (`flash_cpp`)."""
    if flash_cpp.ENABLED and q.device.type == "cuda":
        out = flash_cpp.attention(q, k, v, causal)
        if out is not None:
            return out
    return FlashAttentionTriton.apply(q, k, v, causal)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """FlashAttention-2 over `(..., seq, d)` tensors: the Triton kernels on CUDA (`triton_attention`).

    On the CPU the Triton kernels run only under TRITON_INTERPRET=1 (set before import; slow, meant for tests)
    and not in bf16, which the interpreter cannot compute; otherwise the PyTorch tiled implementation computes
    the same result.
    """
    if q.device.type == "cuda" or (INTERPRET and q.dtype != torch.bfloat16):
        return triton_attention(q, k, v, causal)
    return FlashAttentionPytorch.apply(q, k, v, causal)


# The Triton kernels by the names `last_configs` and `flash_backward(configs_by_kernel=…)` use, for scripts
# that compile or pin one of them (scripts/flash_tune.py, scripts/flash_sass.py).
JIT_KERNELS = {
    "fwd": flash_triton_fwd._flash_attn_fwd_kernel,
    "dkdv": flash_triton_bwd._flash_attn_bwd_dkdv_kernel,
    "dq": flash_triton_bwd._flash_attn_bwd_dq_kernel,
}
# Their shipped config lists, as (BLOCK_M, BLOCK_N, warps, stages, *flags) tuples.
SHIPPED_SHAPES = {
    "fwd": flash_triton_fwd._fwd.shapes, "dkdv": flash_triton_bwd._dkdv.shapes, "dq": flash_triton_bwd._dq.shapes,
}


# Argument kinds of the kernels, for compiling them without a GPU (the kernels take their tensors first).
_FP32_ARGS = {"L", "LSE2", "Delta"}
_SCALARS = {"qk_scale", "sm_scale"}
_ROW_DESCRIPTORS = {"DESC_LSE2", "DESC_DELTA"}  # (Z·H, seq), over fp32 per-row statistics


def compile_sm90(kernel: str, shape: tuple, d: int, causal: bool, tma: bool) -> triton.compiler.CompiledKernel:
    """Compile one of `JIT_KERNELS` for sm_90 (bf16, i32 integers) on any machine, GPU or not: what ptxas
    makes of a config (scripts/flash_sass.py) and which parameters the compiled kernel takes (tests).
    `shape` is a (BLOCK_M, BLOCK_N, warps, stages, *flags) tuple. Returns a triton CompiledKernel, not loaded."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = JIT_KERNELS[kernel]
    config = configs([shape], fn.arg_names)[0]
    consts = {**config.kwargs, "HEAD_DIM": d, "BLOCK_D": d, "CAUSAL": causal, "TMA": tma,
              "HEAD_GROUP": head_group(causal)}
    pointers = fn.arg_names[:fn.arg_names.index("DESC_Q")]
    signature = {}
    for name in fn.arg_names:
        if name in consts:
            signature[name] = "constexpr"
        elif name in DESCRIPTOR_ROWS:
            rows = consts[DESCRIPTOR_ROWS[name]]
            block = f"fp32[1,{rows}]" if name in _ROW_DESCRIPTORS else f"bf16[1,1,{rows},{d}]"
            signature[name] = f"tensordesc<{block}>" if tma else "constexpr"
        elif name in _SCALARS:
            signature[name] = "fp32"
        elif name in pointers:
            signature[name] = "*fp32" if name in _FP32_ARGS else "*bf16"
        else:
            signature[name] = "i32"
    constexprs = {(fn.arg_names.index(n),): v for n, v in consts.items()}
    constexprs.update({(fn.arg_names.index(n),): None for n in DESCRIPTOR_ROWS if n in fn.arg_names and not tma})
    options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    if config.maxnreg:
        options["maxnreg"] = config.maxnreg
    return triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                          target=GPUTarget("cuda", 90, 32), options=options)


def machine_code(compiled: triton.compiler.CompiledKernel) -> tuple[str, str]:
    """A compiled kernel's resource usage (`cuobjdump -res-usage`: registers, stack) and its SASS, from the
    tools bundled with Triton; for kernels compiled by `compile_sm90` here or in `flash_gluon_bwd`."""
    import subprocess
    import tempfile
    from pathlib import Path

    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        usage, sass = (subprocess.run([tools / "cuobjdump", flag, cubin.name], capture_output=True, text=True,
                                      check=True).stdout for flag in ("-res-usage", "-sass"))
    return usage, sass


def tuned_configs() -> dict[str, dict]:
    """Per Triton kernel, the autotuner's chosen config for each tuning key seen in this process."""
    return {**flash_triton_fwd.tuned_configs(), **flash_triton_bwd.tuned_configs()}


def describe_last_configs() -> str:
    """The configs the autotuner last ran, one line for a result row: "fwd 128x64 w8 s3; dkdv …; dq …"
    (BLOCK_MxBLOCK_N, warps, stages, then the config's flags: "ws", "head-first", "overlap", "maxnreg=R"), or
    "gluon …" for a kernel that ran in Gluon instead (`flash_gluon_fwd`, `flash_gluon_bwd`). Empty when
    nothing went through the autotuner (it was switched off)."""
    last = {**flash_triton_fwd.last_configs(), **flash_triton_bwd.last_configs()}
    return "; ".join(
        f"{kernel} {c.kwargs['BLOCK_M']}x{c.kwargs['BLOCK_N']} w{c.num_warps} s{c.num_stages}"
        + "".join(f" {flag.replace('_', '-')}" for flag, const in CONFIG_FLAGS.items() if c.kwargs.get(const))
        + (f" maxnreg={c.maxnreg}" if c.maxnreg else "")
        if c is not None else f"{kernel} {flash_gluon_bwd.last_launch[kernel]}"
        for kernel, c in last.items()
        if c is not None or kernel in flash_gluon_bwd.last_launch
    )
