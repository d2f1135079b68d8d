"""The Gluon kernels: their schedules, read from their sm_90 machine code on any machine (no GPU needed), and on
a GPU their results against float64.

The schedules' point is the order of the tensor-core work: each consumer waits for a matmul with others still in
flight instead of after every wgmma, which is what ptxas silently falls back to when it cannot prove the kernel
safe or runs out of registers.
"""

from __future__ import annotations

import pytest
import torch
import triton
from attention_cases import TOLERANCE, make_inputs, reference, rel_err, run_impl

from profiler_kit.attention import FlashAttentionTriton, FlashOptions, dispatch, flash_options, launch_record
from profiler_kit.attention.gluon_kernels import bwd as gluon_bwd
from profiler_kit.attention.gluon_kernels import fwd as gluon_fwd
from profiler_kit.attention.gluon_kernels.common import gluon, usable
from profiler_kit.attention.options import GluonForwardConfig
from profiler_kit.attention.triton_kernels import fwd as triton_fwd
from profiler_kit.attention.triton_kernels.tiles import as_4d

pytestmark = pytest.mark.skipif(gluon is None, reason="this Triton has no Gluon")


@pytest.mark.parametrize(("head_dim", "config"), [(128, (128, 2, True, True)), (64, (128, 3, False, True))])
def test_forward_keeps_pv_in_flight_while_the_softmax_runs(compiled_facts, head_dim, config):
    """The Gluon forward: each consumer waits for S = Q Kᵀ with the previous tile's P·V still in flight (one
    group), then for all; the partitions' registers are reassigned within the launch's 3 × 168 per thread
    (`gluon_kernels.fwd.CONSUMER_REGS`), without spills."""
    got = compiled_facts(
        "import json, re\n"
        "from profiler_kit.attention.machine_code import compile_sm90, machine_code\n"
        "from profiler_kit.attention.options import GluonForwardConfig\n"
        f"config = GluonForwardConfig(*{config[:3]!r})\n"
        f"usage, sass = machine_code(compile_sm90('gluon-fwd', {head_dim}, {config[3]!r}, config))\n"
        "regs = lambda pattern: [int(r, 16) for r in re.findall(pattern, sass)]\n"
        "print(json.dumps({'stack': int(re.search(r'STACK:(\\d+)', usage).group(1)),\n"
        "                  'waits': re.findall(r'WARPGROUP.DEPBAR.LE gsb0, (0x[0-9a-f]+)', sass),\n"
        "                  'allocs': regs(r'USETMAXREG.TRY_ALLOC.CTAPOOL \\w+, (0x[0-9a-f]+)'),\n"
        "                  'deallocs': regs(r'USETMAXREG.DEALLOC.CTAPOOL (0x[0-9a-f]+)')}))\n"
    )
    assert got["stack"] == 0, "spills"
    # Two consumers, each: S with one group (P·V) in flight, then all; plus the last tile's P·V.
    assert got["waits"].count("0x1") == 2
    assert gluon_fwd.CONSUMER_REGS in got["allocs"] and gluon_fwd.PRODUCER_REGS in got["deallocs"]
    assert max(got["allocs"]) + gluon_fwd.CONSUMER_REGS + gluon_fwd.PRODUCER_REGS <= 3 * 168


@pytest.mark.parametrize(("head_dim", "config", "in_flight"), [
    (128, {"stages": 2, "defer": False, "block_m": 64}, ["0x1", "0x1"]),
    (64, {"stages": 2, "defer": True, "block_m": 64}, ["0x3", "0x2"]),
    (64, {"stages": 2, "defer": False, "block_m": 128}, ["0x1"]),  # dV waited for with dPᵀ
])
def test_two_group_fused_backward_keeps_its_schedule(compiled_facts, head_dim, config, in_flight):
    """The two-warp-group fused backward (`gluon_kernels.bwd`): both consumers get CONSUMER_REGS by `setmaxnreg`
    and the producer the rest of the 3 × 168; no spills (causal); each consumer's waits keep matmuls in flight
    (d = 128: q·kᵀ with dPᵀ, dPᵀ with dV; d = 64, deferred: q·kᵀ with three groups, dPᵀ with two; 128-row query
    tiles: q·kᵀ with dPᵀ) instead of one wait after every wgmma, which is what ptxas falls back to when the
    registers run out; dQ leaves by TMA reductions."""
    got = compiled_facts(
        "import json, re\n"
        "from profiler_kit.attention.machine_code import compile_sm90, machine_code\n"
        "from profiler_kit.attention.options import GluonBackwardConfig\n"
        f"usage, sass = machine_code(compile_sm90('gluon-bwd', {head_dim}, True, GluonBackwardConfig(**{config!r})))\n"
        "regs = lambda pattern: [int(r, 16) for r in re.findall(pattern, sass)]\n"
        "print(json.dumps({'stack': int(re.search(r'STACK:(\\d+)', usage).group(1)),\n"
        "                  'waits': re.findall(r'WARPGROUP.DEPBAR.LE gsb0, (0x[0-9a-f]+)', sass),\n"
        "                  'allocs': regs(r'USETMAXREG.TRY_ALLOC.CTAPOOL \\w+, (0x[0-9a-f]+)'),\n"
        "                  'deallocs': regs(r'USETMAXREG.DEALLOC.CTAPOOL (0x[0-9a-f]+)'),\n"
        "                  'reductions': sass.count('UTMAREDG.2D.ADD')}))\n"
    )
    # Measured with Triton 3.6 (the GPU machine's), which compiles all three without spills; Triton 3.9 keeps the
    # schedules but spills 56 bytes at d = 128 and 104 with 128-row query tiles.
    if config == {"stages": 2, "defer": True, "block_m": 64} or triton.__version__.startswith("3.6."):
        assert got["stack"] == 0, "spills"
    assert got["allocs"].count(gluon_bwd.CONSUMER_REGS) == 2
    assert 2 * gluon_bwd.CONSUMER_REGS + min(got["deallocs"]) <= 3 * gluon_bwd.LAUNCH_MAXNREG
    assert [w for w in got["waits"] if w != "0x0"] == 2 * in_flight
    assert len(got["waits"]) <= 10, "a wait after every wgmma: ptxas ran out of registers"
    assert got["reductions"] == 2


# (leading dims, n_q, n_k, d, causal): ragged tails, a multi-tile causal diagonal, more keys than queries and
# the reverse, both head dims the Gluon kernels take.
GLUON_CASES = [
    ((1, 2), 200, 200, 64, True),
    ((1, 2), 130, 77, 64, False),
    ((1, 2), 77, 200, 64, True),
    ((2, 3), 333, 333, 128, True),
    ((1, 2), 100, 300, 128, False),
]


def _gluon_case_id(value) -> str:
    """A test id for a GLUON_CASES case ("1x2x200x200x64-causal") or a dtype ("float16")."""
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    lead, n_q, n_k, d, causal = value
    return "x".join(map(str, (*lead, n_q, n_k, d))) + "-causal" * causal


def _gluon_backward_case(case: tuple, dtype: torch.dtype = torch.bfloat16) -> tuple:
    """(q, k, v, dO) of a GLUON_CASES case as (Z, H, N, d) tensors, the Triton forward's (O, L) on them, and the
    float64 reference; skips where the Gluon kernels cannot run."""
    lead, n_q, n_k, d, causal = case
    (q, k, v), grad_out = make_inputs(lead, n_q, n_k, d, dtype)
    q4, k4, v4 = (t.detach() for t in (q, k, v))
    if not usable(q4, k4, v4, grad_out):
        pytest.skip("needs Gluon and a GPU of compute capability 9.x")
    forward = triton_fwd.flash_forward(q4, k4, v4, causal)[:2]
    return (q4, k4, v4, grad_out), forward, reference(q, k, v, grad_out, causal)


# The Gluon forward's configs per head dim: (block_n, stages, pingpong).
GLUON_FWD_CONFIGS = {64: [(128, 3, True), (64, 3, True), (128, 2, False)],
                     128: [(128, 2, True), (64, 3, True), (128, 2, False)]}


def fast_only(arguments: list[tuple], fast: tuple[int, ...]) -> list:
    """Test parameters (a tuple of argument values each): `make test-gpu` runs those at the `fast` indices; each
    other one compiles kernels of its own (or autotunes) and runs in `make test-gpu-slow`."""
    return [pytest.param(*values, marks=() if i in fast else pytest.mark.gpu_slow)
            for i, values in enumerate(arguments)]


@pytest.mark.gpu
@pytest.mark.parametrize("case", fast_only(
    [(case,) for case in [*GLUON_CASES, ((1, 2), 300, 140, 128, True), ((2, 1), 129, 129, 64, False)]], fast=(3,)),
    ids=_gluon_case_id)
def test_gluon_forward_matches_reference_gpu(case):
    """The Gluon forward (two consumer warp groups and a producer warp), every config, against float64: O and
    L, bf16 tolerance, with ragged tails, more queries than keys and the reverse, causal and not."""
    lead, n_q, n_k, d, causal = case
    (q, k, v), grad_out = make_inputs(lead, n_q, n_k, d, torch.bfloat16)
    q4, k4, v4 = (as_4d(t.detach()) for t in (q, k, v))
    if not usable(q4, k4, v4):
        pytest.skip("needs Gluon and a GPU of compute capability 9.x")
    want = reference(q, k, v, grad_out, causal)
    for block_n, stages, pingpong in GLUON_FWD_CONFIGS[d]:
        out, lse, _ = gluon_fwd.forward(q4, k4, v4, causal, GluonForwardConfig(block_n, stages, pingpong))
        for name, got in (("o", out.view(want["o"].shape)), ("L", lse.view(want["L"].shape))):
            err = rel_err(got, want[name])
            assert err <= TOLERANCE["cuda"][torch.bfloat16], f"{block_n, stages, pingpong} {name}: {err:.2e}"


@pytest.mark.gpu
@pytest.mark.gpu_slow  # the Triton backward autotunes
@pytest.mark.parametrize("causal", [True, False])
def test_gluon_forward_feeds_the_backward_gpu(causal):
    """FlashAttentionTriton with the Gluon forward chosen (as dispatch chooses it at d = 128 on large calls):
    O, L and all three gradients against float64, and the launch record names the Gluon kernel."""
    (q, k, v), grad_out = make_inputs((2, 3), 333, 333, 128, torch.bfloat16)
    if not usable(*(t.detach() for t in (q, k, v))):
        pytest.skip("needs Gluon and a GPU of compute capability 9.x")
    options = {"gluon_forward": "on", "gluon_forward_config": GluonForwardConfig(128, 3, False),
               "gluon_backward": "off"}
    with flash_options(**options):
        out = FlashAttentionTriton.apply(q, k, v, causal)
    assert "fwd gluon 128x128 s3" in launch_record(out).describe()
    for t in (q, k, v):
        t.grad = None
    with flash_options(**options):
        got = run_impl(FlashAttentionTriton, q, k, v, grad_out, causal)
    want = reference(q, k, v, grad_out, causal)
    for name, expected in want.items():
        err = rel_err(got[name], expected)
        assert err <= TOLERANCE["cuda"][torch.bfloat16], f"{name}: relative error {err:.2e}"


TWO_GROUP_CASES = [
    *((case, torch.bfloat16) for case in [*GLUON_CASES, ((1, 2), 300, 140, 128, True), ((2, 1), 129, 257, 64, False)]),
    (((1, 2), 200, 200, 64, True), torch.float16),
    (((1, 2), 100, 300, 128, False), torch.float16),
]


@pytest.mark.gpu
@pytest.mark.gpu_slow  # the Triton forward that feeds it autotunes
@pytest.mark.parametrize(("case", "dtype"), TWO_GROUP_CASES, ids=_gluon_case_id)
def test_two_group_fused_backward_matches_reference_gpu(case, dtype):
    """The two-warp-group fused backward (`gluon_kernels.bwd`: 128-key blocks, dQ split by columns and added by TMA
    reductions), every offered config, chosen through the options: dQ, dK, dV against float64, with ragged tails,
    more queries than keys and the reverse, causal and not, in bf16 and fp16."""
    d, causal = case[3], case[4]
    (q4, k4, v4, grad_out), (out, lse), want = _gluon_backward_case(case, dtype)
    for config in gluon_bwd.CONFIGS[d]:
        options = FlashOptions(gluon_backward="on", gluon_backward_config=config)
        *got, record = dispatch.backward(q4, k4, v4, out, lse, as_4d(grad_out), causal, options)
        assert record.describe().startswith("dkdv gluon fused")
        for name, value in zip(("dq", "dk", "dv"), got, strict=True):
            err = rel_err(value, want[name])
            assert err <= TOLERANCE["cuda"][dtype], f"{config} {name}: relative error {err:.2e}"
