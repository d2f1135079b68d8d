"""The optional C++ host path of the Triton attention kernels (`flash_cpp`, PROFILER_KIT_FLASH_CPP=1).

On any machine: the parameters it would pass to a real compiled kernel (compiled for sm_90 without a GPU), in
the order and types Triton's launcher passes them. On a GPU with Triton 3.6 and a compiler: the C++ path
gives the Python path's results bit for bit (same kernels, same configs), on fresh tensors each call.
"""

from __future__ import annotations

import struct

import pytest
import torch
import triton

from profiler_kit.attention import flash_cpp, flash_triton_bwd, flash_triton_fwd
from profiler_kit.attention.flash_cpp import I32, I64, POINTER, ROLES, TENSOR_MAP, U32, launch_params
from profiler_kit.attention.flash_triton import triton_attention
from profiler_kit.attention.flash_triton_launch import descriptors, row_descriptors

# cuda.h's CUtensorMapDataType and CUtensorMapSwizzle values.
CU_TENSOR_MAP_DATA_TYPE_FLOAT32, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 7, 9
CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_SWIZZLE_128B = 0, 3


@pytest.fixture(scope="module")
def dkdv_sm90(compiled_facts) -> dict:
    """The leaderboard's dK/dV config at d = 64, causal, TMA loads, compiled for sm_90 (not loaded): its
    parameter names, compiled signature and TMA metadata (compiled in a child process: `compiled_facts`)."""
    code = (
        "import json; from profiler_kit.attention.flash_triton import compile_sm90; "
        "c = compile_sm90('dkdv', (64, 64, 4, 3, 'overlap'), 64, True, True); "
        "print(json.dumps({'arg_names': c.src.fn.arg_names, 'signature': dict(c.src.signature), "
        "'meta': c.metadata.tensordesc_meta}))"
    )
    return compiled_facts(code)


def _dkdv_values(compiled: dict, z=2, h=3, n=200, d=64) -> tuple[dict, dict]:
    """Arguments for the dK/dV kernel as `flash_backward` builds them, by parameter name, and the tensors."""
    t = {name: torch.empty((z, h, n, d), dtype=torch.bfloat16) for name in ("q", "k", "v", "do", "dk", "dv")}
    t["lse2"], t["delta"] = (torch.empty((z * h, 200), dtype=torch.float32) for _ in range(2))
    # The block shapes come from the compiled kernel's metadata, not from these descriptors.
    descs = descriptors(t["q"], t["k"], t["v"], t["do"]) + row_descriptors(t["lse2"], t["delta"])
    strides = [s for name in ("q", "k", "v", "do", "dk") for s in t[name].stride()[:3]]
    runtime = (t["q"], t["k"], t["v"], t["do"], t["lse2"], t["delta"], t["dk"], t["dv"], *descs, *strides,
               h, n, n, 0.18033688, 0.125, 3)
    return dict(zip(compiled["arg_names"], runtime, strict=False)), t


def test_launch_params_follow_tritons_launcher(dkdv_sm90):
    values, t = _dkdv_values(dkdv_sm90)
    params = launch_params(dkdv_sm90["signature"], dkdv_sm90["meta"], values)

    four_d = [TENSOR_MAP] + [I32] * 4 + [I64] * 4  # descriptor, its shape, its strides
    two_d = [TENSOR_MAP] + [I32] * 2 + [I64] * 2
    assert [p[0] for p in params] == [POINTER] * 8 + four_d * 4 + two_d * 2 + [I32] * 18 + [U32] * 2 + [I32]
    # Pointers carry their tensor's role and this launch's address; constexprs are not passed at all.
    assert [p[1:] for p in params[:8]] == [
        [ROLES[name], t[key].data_ptr()] for name, key in
        (("Q", "q"), ("K", "k"), ("V", "v"), ("DO", "do"), ("LSE2", "lse2"), ("Delta", "delta"), ("DK", "dk"),
         ("DV", "dv"))
    ]
    # DESC_Q: cuTensorMapEncodeTiled's arguments, innermost dimension first, strides in bytes.
    q = t["q"]
    assert params[8] == [TENSOR_MAP, ROLES["DESC_Q"], q.data_ptr(), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                         CU_TENSOR_MAP_SWIZZLE_128B, 0, 4, 64, 200, 3, 2,
                         2 * q.stride(2), 2 * q.stride(1), 2 * q.stride(0), 64, 64, 1, 1]
    assert [p[1] for p in params[9:17]] == [2, 3, 200, 64, *q.stride()]
    lse2_map = params[8 + 4 * len(four_d)]
    assert lse2_map == [TENSOR_MAP, ROLES["DESC_LSE2"], t["lse2"].data_ptr(), CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
                        CU_TENSOR_MAP_SWIZZLE_NONE, 0, 2, 200, 6, 4 * 200, 64, 1]
    # The scalars after the descriptors, in signature order; fp32 travels as its bit pattern.
    scalars = params[8 + 4 * len(four_d) + 2 * len(two_d):]
    assert [p[1] for p in scalars[:15]] == [s for name in ("q", "k", "v", "do", "dk") for s in t[name].stride()[:3]]
    assert [p[1] for p in scalars[15:18]] == [3, 200, 200]
    assert scalars[18][1] == struct.unpack("<I", struct.pack("<f", 0.18033688))[0]
    assert scalars[-1] == [I32, 3]


def test_launch_params_refuse_what_they_do_not_cover(dkdv_sm90):
    values, _ = _dkdv_values(dkdv_sm90)
    signature, meta = dkdv_sm90["signature"], dkdv_sm90["meta"]
    # A pointer parameter the role table does not know, a descriptor lowered without TMA, a scalar type the
    # C++ side has no kind for.
    renamed = {("X" if name == "DV" else name): ty for name, ty in signature.items()}
    assert launch_params(renamed, meta, {**values, "X": values["DV"]}) is None
    assert launch_params(signature, None, values) is None
    assert launch_params({**signature, "sm_scale": "fp64"}, meta, values) is None


_GPU_CPP = torch.cuda.is_available() and triton.__version__.startswith(flash_cpp.SUPPORTED_TRITON)


def _layout(case: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape):
        return torch.randn(shape, device="cuda", dtype=dtype, generator=g)

    if case == "4d-ragged":
        return rand(2, 3, 300, 64), rand(2, 3, 300, 64), rand(2, 3, 300, 64)
    if case == "longer-keys-d128":
        return rand(1, 2, 200, 128), rand(1, 2, 333, 128), rand(1, 2, 333, 128)
    if case == "3d":
        return rand(2, 190, 32), rand(2, 190, 32), rand(2, 190, 32)
    # (B, N, H, d) viewed as (B, H, N, d): strided, last dim contiguous.
    return tuple(rand(2, 257, 4, 64).transpose(1, 2) for _ in range(3))


@pytest.mark.skipif(not _GPU_CPP, reason="the C++ launcher needs a CUDA GPU and Triton 3.6")
@pytest.mark.parametrize(("case", "dtype", "causal"), [
    ("4d-ragged", torch.bfloat16, True), ("longer-keys-d128", torch.float16, False),
    ("3d", torch.float32, True), ("transposed", torch.bfloat16, False),
])
def test_cpp_path_matches_the_python_path_bit_for_bit(monkeypatch, case, dtype, causal):
    monkeypatch.setattr(flash_cpp, "ENABLED", True)
    if flash_cpp.extension() is None:
        pytest.skip("the C++ launcher did not build here (see stderr)")
    # Plans made before this test carry no C++ spec: start each kernel's plans afresh.
    for kernel in (flash_triton_fwd._fwd, flash_triton_bwd._preprocess, flash_triton_bwd._dkdv,
                   flash_triton_bwd._dq):
        monkeypatch.setattr(kernel, "_plans", {})
    q, k, v = _layout(case, dtype)

    def run(sum_loss: bool) -> tuple[str, list[torch.Tensor]]:
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]  # new addresses, same strides
        out = triton_attention(*leaves, causal)
        loss = out.float().sum() if sum_loss else (out * torch.ones_like(out)).sum()
        loss.backward()
        return out.grad_fn.name(), [out.detach(), *(t.grad for t in leaves)]

    assert not flash_cpp.has_plan(q, k, v, causal)
    python_node, python = run(sum_loss=False)
    assert flash_cpp.has_plan(q, k, v, causal) and "FlashAttentionTriton" in python_node
    for sum_loss in (False, True):  # a contiguous dO, and the stride-0 dO of a sum
        cpp_node, cpp = run(sum_loss)
        assert "CppNode" in cpp_node
        for name, a, b in zip(("out", "dq", "dk", "dv"), python, cpp, strict=True):
            assert torch.equal(a, b), f"{name} differs between the Python and the C++ path"
