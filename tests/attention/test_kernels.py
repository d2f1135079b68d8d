"""FlashAttention-2 kernels against a float64 reference: outputs, logsumexp and all three gradients.

The small cases use odd lengths so that every kernel meets ragged tiles, multi-tile causal diagonals and its
unmasked fast path. Without a GPU they run the Triton kernels in the interpreter (conftest sets
TRITON_INTERPRET=1); with one they run compiled, on one config per kernel (autotuning would compile every
config of every key: minutes). The `gpu` tests add larger sizes, bf16, and one autotuned run.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from attention_cases import (
    DEVICE,
    HAS_CUDA,
    TOLERANCE,
    assert_matches_reference,
    make_inputs,
    reference,
    rel_err,
    run_impl,
)

from profiler_kit.attention import (
    AttentionInputError,
    FlashAttentionPytorch,
    FlashAttentionTriton,
    flash_attention,
    flash_options,
    launch_record,
    naive_attention,
    tuned_configs,
)
from profiler_kit.attention import dispatch as dispatch_module
from profiler_kit.attention.bench import capture_graph
from profiler_kit.attention.options import INTERPRET
from profiler_kit.attention.triton_kernels import bwd as triton_bwd
from profiler_kit.attention.triton_kernels import configs as triton_configs
from profiler_kit.attention.triton_kernels import function as function_module
from profiler_kit.attention.triton_kernels import fwd as triton_fwd
from profiler_kit.attention.triton_kernels import launcher
from profiler_kit.attention.triton_kernels.tiles import as_4d, grid_position
from profiler_kit.errors import ProfilerKitError

TRITON_RUNS_HERE = HAS_CUDA or INTERPRET
IMPLS = {"torch": FlashAttentionPytorch, "triton": FlashAttentionTriton}


@pytest.fixture
def one_config_per_kernel():
    with flash_options(autotune=False):
        yield

# (leading dims, n_q, n_k, d, causal, dtype): odd lengths, every head dim, 2-D to 4-D inputs.
SMALL_CASES = [
    ((2,), 77, 77, 16, True, torch.float32),
    ((1, 2), 130, 130, 32, False, torch.float32),
    ((2,), 200, 200, 64, True, torch.float32),
    ((), 130, 200, 128, False, torch.float32),
    ((2,), 77, 130, 80, False, torch.float32),  # head dim padded to 128 with masking
    ((2,), 130, 77, 64, True, torch.float32),  # causal, more queries than keys: top-left aligned
    ((2,), 77, 200, 32, True, torch.float32),  # causal, keys past the last query get zero gradients
    ((2,), 200, 200, 64, True, torch.float16),
    ((2,), 130, 77, 80, False, torch.float16),
    ((2,), 200, 130, 128, True, torch.bfloat16),
]


def _case_id(case):
    lead, n_q, n_k, d, causal, dtype = case
    lead_name, dtype_name = "x".join(map(str, lead)) or "none", str(dtype).removeprefix("torch.")
    return f"{lead_name}-q{n_q}-k{n_k}-d{d}-{'causal' if causal else 'full'}-{dtype_name}"


@pytest.mark.usefixtures("one_config_per_kernel")
@pytest.mark.parametrize("impl_name", list(IMPLS))
@pytest.mark.parametrize("case", SMALL_CASES, ids=_case_id)
def test_matches_float64_reference(impl_name, case):
    lead, n_q, n_k, d, causal, dtype = case
    if impl_name == "triton":
        if not TRITON_RUNS_HERE:
            pytest.skip("Triton needs CUDA or TRITON_INTERPRET=1")
        if INTERPRET and dtype == torch.bfloat16:
            pytest.skip("the Triton interpreter cannot compute bf16 (triton#11584); covered by the gpu tests")
    assert_matches_reference(IMPLS[impl_name], lead, n_q, n_k, d, causal, dtype)


@pytest.mark.usefixtures("one_config_per_kernel")
def test_padded_keys_add_nothing_to_dq_when_every_score_is_very_negative():
    """Scores near -1600 put L near -1600: P of a padded key (k = 0, score 0) would be exp(1600) = inf, and
    inf · 0 = NaN in dQ, unless the padded keys are masked wherever dQ is formed from them (77 keys: the last
    key tile is ragged in every config)."""
    if not TRITON_RUNS_HERE:
        pytest.skip("Triton needs CUDA or TRITON_INTERPRET=1")
    gen = torch.Generator().manual_seed(0)
    q = (40 + torch.rand(2, 77, 16, generator=gen)).to(DEVICE).requires_grad_()
    k = (-10 - torch.rand(2, 77, 16, generator=gen)).to(DEVICE).requires_grad_()
    v = torch.randn(2, 77, 16, generator=gen).to(DEVICE).requires_grad_()
    grad_out = torch.randn(2, 77, 16, generator=gen).to(DEVICE)
    got = run_impl(FlashAttentionTriton, q, k, v, grad_out, False)
    want = reference(q, k, v, grad_out, False)
    assert want["L"].max() < -1500
    for name in ("o", "dq", "dk", "dv"):
        assert torch.isfinite(got[name]).all(), name
        if DEVICE == "cpu":
            # fp32 scores of magnitude 1600 carry absolute errors ~1e-4 into P: 100× the usual fp32 bound.
            # (On a GPU, TF32 rounds such scores by ~1, so there only finiteness says something.)
            assert rel_err(got[name], want[name]) <= 100 * TOLERANCE["cpu"][torch.float32], name


@pytest.mark.parametrize("causal", [False, True])
def test_naive_matches_sdpa_in_float64(causal):
    (q, k, v), _ = make_inputs((2, 3), 77, 130, 32, torch.float64, device="cpu")
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.testing.assert_close(naive_attention(q, k, v, is_causal=causal), expected)


@pytest.mark.usefixtures("one_config_per_kernel")
@pytest.mark.parametrize("impl_name", list(IMPLS))
def test_saves_exactly_q_k_v_o_and_logsumexp(impl_name):
    if impl_name == "triton" and not TRITON_RUNS_HERE:
        pytest.skip("Triton needs CUDA or TRITON_INTERPRET=1")
    (q, k, v), _ = make_inputs((2, 3), 77, 77, 32, torch.float32)
    out = IMPLS[impl_name].apply(q, k, v, True)
    saved = out.grad_fn.saved_tensors
    assert len(saved) == 5
    for kept, original in zip(saved[:4], (q, k, v, out), strict=True):
        assert kept.shape == original.shape and kept.data_ptr() == original.data_ptr()
    lse = saved[4]
    assert lse.shape == q.shape[:-1] and lse.dtype == torch.float32


@pytest.mark.usefixtures("one_config_per_kernel")
def test_triton_reads_strided_model_layout():
    """The model passes q/k/v as permuted views of one qkv tensor: they are read in place, grads flow back."""
    if not TRITON_RUNS_HERE:
        pytest.skip("Triton needs CUDA or TRITON_INTERPRET=1")
    batch, seq, heads, d = 2, 77, 3, 32
    gen = torch.Generator().manual_seed(1)
    qkv = torch.randn(batch, seq, 3, heads, d, generator=gen).to(DEVICE).requires_grad_()
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    assert not q.is_contiguous() and as_4d(q).data_ptr() == q.data_ptr()
    grad_out = torch.randn(batch, heads, seq, d, generator=gen).to(DEVICE)
    FlashAttentionTriton.apply(q, k, v, True).backward(grad_out)
    qkv64 = qkv.detach().double().requires_grad_()
    naive_attention(*qkv64.permute(2, 0, 3, 1, 4).unbind(0), is_causal=True).backward(grad_out.double())
    assert rel_err(qkv.grad, qkv64.grad) <= TOLERANCE[DEVICE][torch.float32]


def test_flash_attention_dispatch_on_cpu(monkeypatch):
    (q, k, v), _ = make_inputs((2,), 77, 77, 32, torch.float32, device="cpu")
    expected = "FlashAttentionTriton" if INTERPRET else "FlashAttentionPytorch"
    assert type(flash_attention(q, k, v, causal=True).grad_fn).__name__.startswith(expected)
    # bf16 never goes to the interpreter, and without the interpreter the PyTorch version runs.
    q16, k16, v16 = (t.detach().bfloat16().requires_grad_() for t in (q, k, v))
    assert type(flash_attention(q16, k16, v16).grad_fn).__name__.startswith("FlashAttentionPytorch")
    monkeypatch.setattr(dispatch_module, "INTERPRET", False)
    monkeypatch.setattr(function_module, "INTERPRET", False)
    assert type(flash_attention(q, k, v).grad_fn).__name__.startswith("FlashAttentionPytorch")
    with pytest.raises(AttentionInputError, match="needs CUDA tensors"):
        FlashAttentionTriton.apply(q, k, v, False)


@pytest.mark.usefixtures("one_config_per_kernel")
def test_the_function_keeps_the_launch_record_of_both_passes():
    """Which kernels ran, and their configs, from the Function's context: the forward's after the forward, the
    backward's added after the backward."""
    if not TRITON_RUNS_HERE:
        pytest.skip("the Triton kernels need a GPU or the interpreter")
    (q, k, v), grad_out = make_inputs((2,), 77, 77, 32, torch.float32)
    out = FlashAttentionTriton.apply(q, k, v, True)
    assert [launch.kernel for launch in launch_record(out).launches] == ["fwd"]
    out.backward(grad_out)
    record = launch_record(out)
    assert [launch.kernel for launch in record.launches] == ["fwd", "dkdv", "dq"]
    assert record.describe().startswith("fwd ") and "; dkdv " in record.describe()
    assert launch_record(naive_attention(q, k, v)) is None


def test_triton_rejects_bf16_in_the_interpreter(monkeypatch):
    monkeypatch.setattr(function_module, "INTERPRET", True)
    (q, k, v), _ = make_inputs((2,), 77, 77, 32, torch.bfloat16, device="cpu")
    with pytest.raises(AttentionInputError, match="bfloat16"):
        FlashAttentionTriton.apply(q, k, v, False)


def test_h100_default_configs_in_the_interpreter(monkeypatch):
    """The launch path used without autotuning, on the large GPU tiles (128×64 forward, 32×128 dK/dV...)."""
    if not INTERPRET:
        pytest.skip("interpreter only")
    monkeypatch.setattr(launcher, "INTERPRET", False)
    with flash_options(autotune=False):
        assert_matches_reference(FlashAttentionTriton, (2,), 200, 200, 64, True, torch.float32)
        assert_matches_reference(FlashAttentionTriton, (2,), 130, 77, 80, False, torch.float16)


def _run_kernels(q, k, v, grad_out, causal, tma):
    """Forward and backward launchers called directly, with TMA descriptor or pointer loads forced."""
    q4, k4, v4 = (as_4d(t.detach()) for t in (q, k, v))
    out, lse, _ = triton_fwd.flash_forward(q4, k4, v4, causal, tma=tma)
    dq, dk, dv, _ = triton_bwd.flash_backward(q4, k4, v4, out, lse, as_4d(grad_out), causal, tma=tma)
    return {"o": out.view(q.shape), "L": lse.view(q.shape[:-1]), "dq": dq.view(q.shape), "dk": dk.view(k.shape),
            "dv": dv.view(v.shape)}


# Ragged lengths, a padded head dim, causal with more queries than keys: what TMA's zero fill must get right.
TMA_CASES = [
    ((2,), 77, 77, 16, True, torch.float32),
    ((1, 2), 130, 77, 80, False, torch.float16),
    ((2,), 130, 77, 64, True, torch.float32),
]


@pytest.mark.usefixtures("one_config_per_kernel")
@pytest.mark.parametrize("tma", [False, True], ids=["pointer", "tma"])
@pytest.mark.parametrize("case", TMA_CASES, ids=_case_id)
def test_tma_and_pointer_loads_match_reference(case, tma):
    """Both load paths, forced: the interpreter runs TMA descriptors too (not just GPUs of compute capability 9+)."""
    if not INTERPRET:
        pytest.skip("interpreter only; on a GPU test_tma_and_pointer_loads_gpu covers both paths")
    lead, n_q, n_k, d, causal, dtype = case
    (q, k, v), grad_out = make_inputs(lead, n_q, n_k, d, dtype)
    got = _run_kernels(q, k, v, grad_out, causal, tma)
    want = reference(q, k, v, grad_out, causal)
    for name, expected in want.items():
        err = rel_err(got[name], expected)
        assert err <= TOLERANCE[DEVICE][dtype], f"{name}: relative error {err:.2e}"


@pytest.mark.parametrize("flag", ["HEAD_FIRST", "OVERLAP"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_config_flags_match_reference(monkeypatch, flag, causal):
    """Each config flag's code path, in every kernel that has it. HEAD_FIRST: the (Z·H, tiles) launch order,
    where each kernel must still find its tile and head on the swapped axes. OVERLAP: the dK/dV kernel's
    early dPᵀ."""
    if not INTERPRET:
        pytest.skip("interpreter only; on a GPU the autotuner runs these configs against the reference")
    for kernel in (triton_fwd.FWD, triton_bwd.DKDV, triton_bwd.DQ):
        if flag in kernel.interpret_blocks:
            monkeypatch.setitem(kernel.interpret_blocks, flag, True)
    assert_matches_reference(FlashAttentionTriton, (2, 3), 77, 130, 32, causal, torch.float32)


@pytest.mark.parametrize("kernel,blocks", [
    ("dkdv", {"BLOCK_M": 32, "BLOCK_N": 16}),
    ("dkdv", {"BLOCK_M": 64, "BLOCK_N": 16}),
    ("fwd", {"BLOCK_M": 16, "BLOCK_N": 32}),
    ("dq", {"BLOCK_M": 16, "BLOCK_N": 32}),
], ids=["dkdv-m32-n16", "dkdv-m64-n16", "fwd-m16-n32", "dq-m16-n32"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_streamed_tiles_wider_than_the_resident_tile(monkeypatch, kernel, blocks, causal):
    """Each kernel with its streamed tile wider than its resident one (77 and 130 rows, ragged both ways).
    dK/dV: one masked query tile crosses each key tile's diagonal, and the unmasked tiles after it start off
    the BLOCK_M grid. Forward and dQ: a query tile's diagonal starts inside a key tile, which must be masked
    (key_ranges rounds the unmasked stop down to whole key tiles)."""
    if not INTERPRET:
        pytest.skip("interpreter only; on a GPU tools/flash_tune.py times these configs against the pointer version")
    owner = {"fwd": triton_fwd.FWD, "dkdv": triton_bwd.DKDV, "dq": triton_bwd.DQ}[kernel]
    for name, size in blocks.items():
        monkeypatch.setitem(owner.interpret_blocks, name, size)
    assert_matches_reference(FlashAttentionTriton, (2,), 130, 77, 32, causal, torch.float32)
    assert_matches_reference(FlashAttentionTriton, (2,), 77, 130, 32, causal, torch.float32)


def test_tma_only_for_aligned_16_bit_tensors():
    half = torch.randn(2, 3, 77, 64).half()
    assert launcher.tma_usable(half, half) == INTERPRET  # no GPU here: only the interpreter qualifies
    if INTERPRET:
        assert not launcher.tma_usable(half.float())  # fp32 tiles keep pointer loads
        assert not launcher.tma_usable(torch.randn(2, 77, 20).half())  # 40-byte rows: not 16-aligned
        assert not launcher.tma_usable(torch.randn(2, 77, 72).half()[:, :, 1:65])  # base off by 2 bytes
        assert launcher.tma_usable(half.transpose(1, 2).contiguous().transpose(1, 2))  # permuted views
        assert not launcher.tma_usable(torch.randn(1, 64).half().expand(3, 77, 64))  # broadcast: stride 0


@pytest.mark.parametrize("dtype,d,tma,offered", [
    (torch.bfloat16, 128, True, True),
    (torch.bfloat16, 128, False, False),  # pointer loads: never tuned with warp specialisation
    (torch.bfloat16, 64, True, False),
    (torch.float32, 128, False, False),
])
def test_warp_specialised_configs_only_where_they_were_tuned(dtype, d, tma, offered):
    q = torch.empty(1, 1, 16, d, dtype=dtype)
    for kernel in (triton_bwd.DKDV, triton_bwd.DQ):
        kept = kernel.pruner(kernel.configs, {"Q": q}, HEAD_DIM=d, TMA=tma, CAUSAL=False)
        assert any(c.kwargs["WS"] for c in kept) == offered
        assert kept and all(c.num_warps == 8 for c in kept if c.kwargs["WS"])


@pytest.mark.parametrize("d,offered", [(32, True), (64, True), (128, False)])
def test_regs_configs_only_where_they_were_tuned(d, offered):
    """Configs feeding the resident tiles from registers are offered at d ≤ 64 (at 128 they spill)."""
    q = torch.empty(1, 1, 16, d, dtype=torch.bfloat16)
    kernel = triton_bwd.DKDV
    kept = kernel.pruner(kernel.configs, {"Q": q}, HEAD_DIM=d, TMA=True, CAUSAL=True)
    assert kept and any(c.kwargs["REGS"] for c in kept) == offered


@pytest.mark.parametrize("d,causal,head_first", [(64, True, True), (32, True, True), (64, False, False),
                                                 (128, True, False), (128, False, False)])
def test_forward_and_dq_grid_order_follows_the_shape(d, causal, head_first):
    """The forward and dQ kernels are offered one grid order per shape (head-first only when causal at d ≤ 64),
    so that the autotuner never chooses between a config and its head-first twin; dK/dV keeps both."""
    q = torch.empty(1, 1, 16, d, dtype=torch.bfloat16)
    for kernel in (triton_fwd.FWD, triton_bwd.DQ):
        kept = kernel.pruner(kernel.configs, {"Q": q}, HEAD_DIM=d, TMA=True, CAUSAL=causal)
        assert kept and all(c.kwargs["HEAD_FIRST"] == head_first for c in kept)
    orders = {c.kwargs["HEAD_FIRST"] for c in triton_bwd.DKDV.pruner(
        triton_bwd.DKDV.configs, {"Q": q}, HEAD_DIM=64, TMA=True, CAUSAL=True)}
    assert orders == {False, True}


@triton.jit
def _record_grid_positions(Out, HEAD_FIRST: tl.constexpr, HEAD_GROUP: tl.constexpr):
    tile, _, head = grid_position(HEAD_FIRST, HEAD_GROUP)
    linear = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)  # the order the GPU starts blocks in
    tl.store(Out + 2 * linear, tile)
    tl.store(Out + 2 * linear + 1, head)


@pytest.mark.parametrize("head_first,group", [(False, 1), (False, 4), (True, 1)])
def test_grid_position_orders_tiles_and_heads(head_first, group):
    """Blocks in launch order own: one head's tiles after another's (group 1); tile by tile across a group of
    heads, group after group, the last one smaller (group 4 of 6 heads); tile by tile across all heads
    (head-first). Every (tile, head) exactly once."""
    tiles, heads = 5, 6
    out = torch.full((tiles * heads, 2), -1, dtype=torch.int32, device=DEVICE)
    _record_grid_positions[(heads, tiles) if head_first else (tiles, heads)](out, head_first, group)
    if head_first:
        expected = [(t, h) for t in range(tiles) for h in range(heads)]
    elif group == 1:
        expected = [(t, h) for h in range(heads) for t in range(tiles)]
    else:
        expected = [(t, h) for first in (0, 4) for t in range(tiles) for h in range(first, min(heads, first + 4))]
    assert [tuple(row) for row in out.tolist()] == expected


@pytest.mark.parametrize(
    "kernel,resident,streamed",
    [
        (triton_fwd.FWD, "BLOCK_M", "BLOCK_N"),
        (triton_bwd.DKDV, "BLOCK_N", "BLOCK_M"),
        (triton_bwd.DQ, "BLOCK_M", "BLOCK_N"),
    ],
    ids=["fwd", "dkdv", "dq"],
)
def test_autotune_configs_split_the_causal_diagonal_evenly(kernel, resident, streamed):
    """Each kernel walks the diagonal of its resident tile in whole streamed tiles."""
    for config in kernel.configs:
        assert config.kwargs[resident] % config.kwargs[streamed] == 0, config


def _shapes(q=(2, 77, 32), k=(2, 77, 32), v=(2, 77, 32), dtype=torch.float32):
    return [torch.randn(*s).to(dtype) for s in (q, k, v)]


BAD_INPUTS = [
    (_shapes(k=(2, 77, 64), v=(2, 77, 64)), "head dims differ"),
    (_shapes(q=(2, 77, 8), k=(2, 77, 8), v=(2, 77, 8)), r"head dim 8 unsupported"),
    (_shapes(q=(2, 77, 256), k=(2, 77, 256), v=(2, 77, 256)), r"head dim 256 unsupported"),
    (_shapes(dtype=torch.float64), "dtype torch.float64"),
    (_shapes()[:2] + [torch.randn(2, 77, 32).half()], "dtypes differ"),
    (_shapes(k=(3, 77, 32)), "leading dims differ"),
    (_shapes(v=(2, 78, 32)), "77 keys but v has 78"),
    (_shapes(q=(77,)), r"shape \(\.\.\., seq, d\)"),
    (_shapes(q=(2, 0, 32)), "empty inputs"),
]


@pytest.mark.parametrize("impl_name", list(IMPLS))
@pytest.mark.parametrize("inputs,message", BAD_INPUTS, ids=[m for _, m in BAD_INPUTS])
def test_rejects_bad_inputs(impl_name, inputs, message):
    with pytest.raises(AttentionInputError, match=message) as info:
        IMPLS[impl_name].apply(*inputs, False)
    # One error type serves both audiences: the CLI's ProfilerKitError and a library caller's ValueError.
    assert isinstance(info.value, ProfilerKitError) and isinstance(info.value, ValueError)


GPU_CASES = [
    (n, d, causal, dtype)
    for n, d in ((1024, 64), (2000, 128), (1024, 80))
    for causal in (False, True)
    for dtype in (torch.bfloat16, torch.float32)
]


# `make test-gpu` runs these; every other case compiles kernels of its own and runs in `make test-gpu-slow`.
FAST_GPU_CASES = {("torch", 1024, 64, True, torch.bfloat16), ("triton", 1024, 64, True, torch.bfloat16),
                  ("triton", 2000, 128, True, torch.bfloat16), ("triton", 1024, 80, False, torch.float32)}


@pytest.mark.gpu
@pytest.mark.usefixtures("one_config_per_kernel")
@pytest.mark.parametrize(
    "impl_name,n,d,causal,dtype",
    [pytest.param(impl, *case, id=f"{_case_id(((2, 4), case[0], case[0], *case[1:]))}-{impl}",
                  marks=() if (impl, *case) in FAST_GPU_CASES else pytest.mark.gpu_slow)
     for case in GPU_CASES for impl in IMPLS],
)
def test_matches_float64_reference_gpu(impl_name, n, d, causal, dtype):
    assert_matches_reference(IMPLS[impl_name], (2, 4), n, n, d, causal, dtype)


@pytest.mark.gpu
@pytest.mark.usefixtures("one_config_per_kernel")
@pytest.mark.parametrize("causal", [pytest.param(False, marks=pytest.mark.gpu_slow), True])
def test_different_lengths_gpu(causal):
    assert_matches_reference(FlashAttentionTriton, (2, 4), 1000, 1537, 64, causal, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.usefixtures("one_config_per_kernel")
@pytest.mark.parametrize("tma", [pytest.param(False, marks=pytest.mark.gpu_slow), True], ids=["pointer", "tma"])
def test_tma_and_pointer_loads_gpu(tma):
    if tma and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs compute capability 9.0+")
    (q, k, v), grad_out = make_inputs((2, 4), 1000, 1537, 80, torch.bfloat16)
    got = _run_kernels(q, k, v, grad_out, True, tma)
    want = reference(q, k, v, grad_out, True)
    for name, expected in want.items():
        assert rel_err(got[name], expected) <= TOLERANCE["cuda"][torch.bfloat16], name


@pytest.mark.gpu
@pytest.mark.gpu_slow
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_regs_flag_computes_the_same_bits_gpu(causal):
    """The "regs" flag only moves the resident tiles' matmul operand from shared memory into registers: every
    kernel must compute exactly what the same config without it computes (ragged lengths, d = 64)."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the flag is for wgmma (compute capability 9.0+)")
    (q, k, v), grad_out = make_inputs((2, 3), 1000, 777, 64, torch.bfloat16)
    shapes = {"fwd": (128, 64, 8, 3), "dkdv": (64, 64, 4, 4, "overlap"), "dq": (64, 64, 4, 3)}
    results = []
    for extra in ((), ("regs",)):
        pinned = {name: triton_configs.configs([(*shape, *extra)], jit.arg_names)[0]
                  for name, shape in shapes.items() for jit in [triton_bwd.KERNELS[name].fn]}
        out, lse, _ = triton_fwd.flash_forward(q, k, v, causal, pinned["fwd"])
        *grads, _ = triton_bwd.flash_backward(q, k, v, out, lse, as_4d(grad_out), causal,
                                              configs_by_kernel={"dkdv": pinned["dkdv"], "dq": pinned["dq"]})
        results.append((out, lse, *grads))
    for name, without, with_regs in zip(("O", "L", "dQ", "dK", "dV"), *results, strict=True):
        assert torch.equal(without, with_regs), name


@pytest.mark.gpu
@pytest.mark.gpu_slow
def test_autotuned_kernels_gpu():
    """The configs the autotuner picks are correct too (compiles every config of one key: ~1 min)."""
    assert_matches_reference(FlashAttentionTriton, (2, 4), 2000, 2000, 64, True, torch.bfloat16)
    chosen = tuned_configs()
    for kernel in ("_flash_attn_fwd_kernel", "_flash_attn_bwd_dkdv_kernel", "_flash_attn_bwd_dq_kernel"):
        assert chosen[kernel], f"{kernel} was not autotuned"


@pytest.mark.gpu
@pytest.mark.gpu_slow  # autotunes
def test_direct_launches_match_dispatched_ones_gpu():
    """After the first call, calls with the same signature launch the compiled kernels directly: they must
    compute bit for bit what Triton's own dispatch computes, and an input Triton would specialise differently
    (a view one element in, no longer 16-byte aligned) must get a launch of its own."""
    (q, k, v), grad_out = make_inputs((2, 4), 1000, 1000, 64, torch.float16)
    kernels = (triton_fwd.FWD, triton_bwd.PREPROCESS, triton_bwd.DKDV, triton_bwd.DQ)

    def run(q, k, v):
        out = FlashAttentionTriton.apply(q, k, v, True)
        grads = torch.autograd.grad(out, (q, k, v), grad_out)
        return (out, *grads), launch_record(out).describe()

    with flash_options(direct_launch=False):
        dispatched, dispatched_record = run(q, k, v)
    run(q, k, v)  # resolves the launches
    plans = [len(kernel._plans) for kernel in kernels]
    direct, direct_record = run(q, k, v)
    assert [len(kernel._plans) for kernel in kernels] == plans and all(plans)
    for got, want in zip(direct, dispatched, strict=True):
        assert torch.equal(got, want)
    assert direct_record == dispatched_record and direct_record.count(";") == 2  # fwd; dkdv; dq

    buffer = torch.randn(q.numel() + 1, dtype=q.dtype, device=q.device)
    unaligned = buffer[1:].view(q.shape).requires_grad_()
    run(unaligned, k, v)
    assert [len(kernel._plans) for kernel in kernels] == [n + 1 for n in plans]
    want = reference(unaligned, k, v, grad_out, True)
    got = dict(zip(("o", "dq", "dk", "dv"), run(unaligned, k, v)[0], strict=True))
    for name, value in got.items():
        assert rel_err(value, want[name]) <= TOLERANCE["cuda"][torch.float16], name


@pytest.mark.gpu
@pytest.mark.gpu_slow  # autotunes
def test_forward_backward_replays_from_a_cuda_graph_gpu():
    """Captured once (after an eager warm-up), forward+backward on the default path (autotuned, then direct
    launches) replays on new values of the same tensors and computes what eager calls compute: the launches
    hold no host state that a replay would miss."""
    (q, k, v), grad_out = make_inputs((2, 4), 1000, 1000, 64, torch.float16)

    def step():
        for t in (q, k, v):
            t.grad = None
        FlashAttentionTriton.apply(q, k, v, True).backward(grad_out)

    step()  # compiles outside the capture
    graph = capture_graph(step)
    grads = [t.grad for t in (q, k, v)]  # the graph's outputs, rewritten by each replay

    (q2, k2, v2), grad_out2 = make_inputs((2, 4), 1000, 1000, 64, torch.float16, seed=1)
    with torch.no_grad():
        for static, new in ((q, q2), (k, k2), (v, v2), (grad_out, grad_out2)):
            static.copy_(new)
    graph.replay()
    want = reference(q2, k2, v2, grad_out2, True)
    for name, got in zip(("dq", "dk", "dv"), grads, strict=True):
        assert rel_err(got, want[name]) <= TOLERANCE["cuda"][torch.float16], name
