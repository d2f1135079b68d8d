"""An optional C++ host path for the Triton attention kernels (PROFILER_KIT_FLASH_CPP=1).

Why. Below N ≈ 8192 a flash-triton forward+backward is limited by the host, not the GPU: on the H100 machine
the Python path costs ~700 µs per call against SDPA's ~190 µs, and a Python autograd Function that does
nothing but clone already costs ~150 µs (docs/results/attention-h100.md, steps 6 and 14). No trimming of the
Python path reaches SDPA, so this module moves the steady state into C++ (`csrc/flash_launch.cpp`).

How. The first forward+backward with a given input layout runs through Python as always (autotuning,
compiling, launching). Its backward then registers that layout's four launches (forward, D pre-pass, dK/dV,
dQ) with the extension: each compiled kernel's function handle, grid, block, shared memory and every
parameter, in the order and types Triton 3.6's own launcher passes them (`launch_params`). Every integer the
kernels take follows from the layout (see `flash_triton_launch`), so later calls with the same layout run as
a C++ autograd Function that only allocates the outputs, writes the tensors' addresses into the pointer
parameters and TMA descriptors, and calls cuLaunchKernelEx; its backward runs without Python at all.

Opt-in because it builds a C++ extension on first use (torch.utils.cpp_extension, about a minute, cached
under torch's extensions directory) and needs a compiler and the CUDA headers. It is used only with Triton
3.6, whose launcher `launch_params` mirrors; kernels that need anything it does not cover (global or profile
scratch, clusters, programmatic dependent launch, tensor descriptors lowered without TMA) keep the Python
path, and so do calls while a Triton launch hook (a profiler) is installed.
"""

from __future__ import annotations

import functools
import os
import struct
import sys
import types
from pathlib import Path

import torch
import triton

try:  # Triton ≥ 3.4 (its launch hooks live here); without it the path is never enabled.
    from triton import knobs
except ImportError:  # pragma: no cover - depends on the installed Triton
    knobs = None

CPP_ENV = "PROFILER_KIT_FLASH_CPP"
SUPPORTED_TRITON = ("3.6.",)
SOURCE = Path(__file__).with_name("csrc") / "flash_launch.cpp"

# The tensors a launch touches, by the kernel parameter names that carry them; csrc/flash_launch.cpp's
# `Role` numbers them the same way.
ROLES = {
    "Q": 0, "DESC_Q": 0, "K": 1, "DESC_K": 1, "V": 2, "DESC_V": 2, "Out": 3, "DESC_O": 3, "L": 4,
    "DO": 5, "DESC_DO": 5, "Delta": 6, "DESC_DELTA": 6, "LSE2": 7, "DESC_LSE2": 7, "DQ": 8, "DK": 9, "DV": 10,
}
INPUT_ROLES = {0: "q", 1: "k", 2: "v"}
# Parameter kinds, as csrc/flash_launch.cpp's `Kind` numbers them.
POINTER, I32, I64, U32, I8, TENSOR_MAP = range(6)
# Triton's scalar types and the kind that carries each one's bytes (fp32 travels as its bit pattern).
_SCALAR_KINDS = {"i1": I8, "i8": I8, "u1": I8, "u8": I8, "i32": I32, "u32": U32, "i64": I64, "u64": I64,
                 "fp32": U32, "f32": U32}


def _wanted() -> bool:
    if os.environ.get(CPP_ENV, "0") != "1" or os.environ.get("TRITON_INTERPRET", "0") == "1":
        return False
    if not triton.__version__.startswith(SUPPORTED_TRITON):
        print(f"profiler-kit: {CPP_ENV}=1 ignored: the C++ launcher mirrors Triton {SUPPORTED_TRITON[0]}x's "
              f"launcher, this is Triton {triton.__version__}", file=sys.stderr)
        return False
    return True


ENABLED = _wanted()


def _tensor_map(role: int, desc, meta: dict) -> list[int] | None:
    """A TMA descriptor parameter: what Triton's fill_tma_descriptor passes to cuTensorMapEncodeTiled
    (dims, byte strides and box innermost first)."""
    if meta.get("fp4_padded") or desc.strides[-1] != 1:
        return None
    from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST

    elem = meta["elem_size"]
    dims = list(desc.shape)[::-1]
    byte_strides = [elem * s for s in desc.strides[:-1]][::-1]
    box = list(meta["block_size"])[::-1]
    fill = 1 if getattr(desc, "padding", "zero") == "nan" else 0  # CU_TENSOR_MAP_FLOAT_OOB_FILL_{NONE, NAN_…}
    return [TENSOR_MAP, role, desc.base.data_ptr(), TMA_DTYPE_DEVICE_TO_HOST[meta["elem_type"]], meta["swizzle"],
            fill, len(dims), *dims, *byte_strides, *box]


def launch_params(signature: dict[str, str], tensordesc_meta: list | None, values: dict) -> list[list[int]] | None:
    """The kernel parameters Triton 3.6's launcher passes, in its order: each non-constexpr argument of the
    compiled `signature` (name → Triton type), a TMA descriptor expanded into the descriptor, its shape (i32)
    and its strides (i64). Pointers and descriptors name the role of the tensor they carry (`ROLES`) and,
    for checking, the address this launch had. None when an argument is of a kind not covered here."""
    params: list[list[int]] = []
    metas = iter(tensordesc_meta or [])
    for name, ty in signature.items():
        if ty == "constexpr":
            continue
        value = values[name]
        if ty.startswith("tensordesc"):
            meta, role = next(metas, None), ROLES.get(name)
            tensor_map = None if meta is None or role is None else _tensor_map(role, value, meta)
            if tensor_map is None:
                return None
            params.append(tensor_map)
            params.extend([I32, int(s)] for s in value.shape)
            params.extend([I64, int(s)] for s in value.strides)
        elif ty.startswith("*"):
            if name not in ROLES:
                return None
            params.append([POINTER, ROLES[name], value.data_ptr()])
        elif ty in ("fp32", "f32"):
            params.append([U32, struct.unpack("<I", struct.pack("<f", value))[0]])
        elif ty in _SCALAR_KINDS:
            params.append([_SCALAR_KINDS[ty], int(value)])
        else:
            return None
    return params


def launch_spec(compiled, grid: tuple[int, int, int], values: dict) -> tuple | None:
    """What the extension needs to repeat a launch of `compiled` (a loaded triton CompiledKernel) on `grid`
    with the arguments `values` (parameter name → value), or None where `launch_params` does not cover it."""
    md = compiled.metadata
    if (getattr(md, "num_ctas", 1) != 1 or getattr(md, "launch_cooperative_grid", False)
            or getattr(md, "launch_pdl", False) or getattr(md, "global_scratch_size", 0)
            or getattr(md, "profile_scratch_size", 0) or compiled.function is None):
        return None
    params = launch_params(dict(compiled.src.signature), getattr(md, "tensordesc_meta", None), values)
    if params is None:
        return None
    return compiled.function, list(grid), 32 * md.num_warps, md.shared, params


@functools.cache
def extension() -> types.ModuleType | None:
    """The compiled extension (built on first use), or None when it cannot be built here."""
    from torch.utils import cpp_extension

    print("profiler-kit: loading the C++ flash launcher (the first build takes about a minute)", file=sys.stderr)
    try:
        return cpp_extension.load(name="profiler_kit_flash_launch", sources=[str(SOURCE)], with_cuda=True)
    except Exception as exc:  # noqa: BLE001 - any build failure leaves the Python path in use
        print(f"profiler-kit: the C++ flash launcher did not build, the Python path stays in use: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return None


def _hooked() -> bool:
    """Whether a Triton launch hook is installed (Triton 3.6 keeps them in HookChains, empty by default)."""
    hooks = (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
    return any(hook is not None and getattr(hook, "calls", True) for hook in hooks)


def _serving() -> types.ModuleType | None:
    """The extension, when the path is on, built and not stepping aside for a launch hook."""
    ext = extension() if ENABLED else None
    return None if ext is None or _hooked() else ext


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor | None:
    """The attention output through the C++ path, or None when this layout has no plan (or the path is off)."""
    ext = _serving()
    return None if ext is None else ext.attention(q, k, v, causal)


def has_plan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> bool:
    """Whether calls with q, k, v's layout take the C++ path."""
    ext = _serving()
    return ext is not None and ext.has_plan(q, k, v, causal)


def register(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, grad_out: torch.Tensor,
             specs: dict[str, tuple | None], stat_shape: tuple[int, int]) -> bool:
    """Register the launches one Python forward+backward made (`specs`: "fwd", "preprocess", "dkdv", "dq")
    for q, k, v's layout. Only a call whose dO was contiguous and 16-byte aligned, as the C++ backward makes
    it, and whose q, k, v needed no copy, qualifies; returns whether the layout was registered."""
    ext = extension()
    order = ("fwd", "preprocess", "dkdv", "dq")
    if ext is None or any(specs.get(name) is None for name in order):
        return False
    if ext.has_plan(q, k, v, causal):  # registered already (this call took the Python path for another reason)
        return True
    if not grad_out.is_contiguous() or grad_out.data_ptr() % 16 or any(t.stride(-1) != 1 for t in (q, k, v)):
        return False
    inputs = {"q": q.data_ptr(), "k": k.data_ptr(), "v": v.data_ptr()}
    for name in order:
        for param in specs[name][4]:
            if param[0] in (POINTER, TENSOR_MAP) and param[1] in INPUT_ROLES:
                if param[2] != inputs[INPUT_ROLES[param[1]]]:
                    raise RuntimeError(f"flash launcher: {name}'s parameter for {INPUT_ROLES[param[1]]} does not "
                                       "hold that tensor; the role table is out of date")
    ext.register_plan(q, k, v, causal, *(specs[name] for name in order), *stat_shape)
    return True
