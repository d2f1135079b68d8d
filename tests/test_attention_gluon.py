"""The Gluon dK/dV and fused backward kernels' schedules, read from their sm_90 machine code on any machine
(no GPU needed).

Its point is the order of the tensor-core work (`flash_gluon_bwd`): each iteration issues q·kᵀ, dPᵀ and the
previous tile's dK and dV, then waits for q·kᵀ with three matmul groups still in flight and for dPᵀ with two.
ptxas drops that overlap silently when it cannot prove the kernel safe (step 16 of
docs/results/attention-h100.md: a version that kept q·kᵀ in flight across iterations compiled to one wait
after every wgmma). Correctness against float64 is a GPU test in test_attention_kernels.py.
"""

from __future__ import annotations

import pytest
import torch
import triton

from profiler_kit.attention import flash_gluon_bwd, flash_gluon_fused, flash_gluon_fwd

pytestmark = pytest.mark.skipif(flash_gluon_bwd.gluon is None, reason="this Triton has no Gluon")


def _compiled(compiled_facts, head_dim: int, config: tuple[int, int, int, int], with_dq: bool = False) -> dict:
    """Registers, spill bytes, the wgmma waits and the TMA reductions of a config compiled for sm_90."""
    return compiled_facts(
        "import json, re\n"
        "from profiler_kit.attention.flash_gluon_bwd import compile_sm90\n"
        "from profiler_kit.attention.flash_triton import machine_code\n"
        f"usage, sass = machine_code(compile_sm90({head_dim}, *{config!r}, with_dq={with_dq!r}))\n"
        "print(json.dumps({'regs': int(re.search(r'REG:(\\d+)', usage).group(1)),\n"
        "                  'stack': int(re.search(r'STACK:(\\d+)', usage).group(1)),\n"
        "                  'waits': re.findall(r'WARPGROUP.DEPBAR.LE gsb0, (0x[0-9a-f]+)', sass),\n"
        "                  'wgmma': sass.count('HGMMA'), 'reductions': sass.count('UTMAREDG.2D.ADD')}))\n"
    )


@pytest.mark.parametrize(("head_dim", "config"), [(64, (64, 64, 3, 4)), (128, (64, 64, 2, 4))])
def test_matmuls_stay_in_flight_while_the_exp2_runs(compiled_facts, head_dim, config):
    got = _compiled(compiled_facts, head_dim, config)
    assert got["stack"] == 0, "spills"
    # Two blocks of 4 warps per SM need ≤ 255 registers per thread (65536 / (2 · 128)).
    assert got["regs"] <= 255
    # The loop's waits: q·kᵀ with 3 groups in flight, dPᵀ with 2, then all; not one wait per wgmma.
    assert {"0x3", "0x2"} <= set(got["waits"])
    assert len(got["waits"]) < got["wgmma"] // 2


@pytest.mark.parametrize("stages", [2, 3])
def test_fused_kernel_keeps_four_matmuls_in_flight_and_reduces_dq_by_tma(compiled_facts, stages):
    """The fused kernel (d = 64) issues five matmul groups per tile and waits for q·kᵀ with four still in
    flight, for dPᵀ with three; dQ leaves by TMA reductions (in the loop and after it), with no spills at
    two blocks per SM."""
    got = _compiled(compiled_facts, 64, (64, 64, stages, 4), with_dq=True)
    assert got["stack"] == 0, "spills"
    assert got["regs"] <= 255
    assert {"0x4", "0x3"} <= set(got["waits"])
    assert len(got["waits"]) < got["wgmma"] // 2
    assert got["reductions"] == 2


@pytest.mark.parametrize(("head_dim", "config"), [(128, (128, 2, True, True)), (64, (128, 3, False, True))])
def test_forward_keeps_pv_in_flight_while_the_softmax_runs(compiled_facts, head_dim, config):
    """The Gluon forward: each consumer waits for S = Q Kᵀ with the previous tile's P·V still in flight (one
    group), then for all; the partitions' registers are reassigned within the launch's 3 × 168 per thread
    (`flash_gluon_fwd.CONSUMER_REGS`), without spills."""
    got = compiled_facts(
        "import json, re\n"
        "from profiler_kit.attention.flash_gluon_fwd import compile_sm90\n"
        "from profiler_kit.attention.flash_triton import machine_code\n"
        f"usage, sass = machine_code(compile_sm90({head_dim}, *{config!r}))\n"
        "regs = lambda pattern: [int(r, 16) for r in re.findall(pattern, sass)]\n"
        "print(json.dumps({'stack': int(re.search(r'STACK:(\\d+)', usage).group(1)),\n"
        "                  'waits': re.findall(r'WARPGROUP.DEPBAR.LE gsb0, (0x[0-9a-f]+)', sass),\n"
        "                  'allocs': regs(r'USETMAXREG.TRY_ALLOC.CTAPOOL \\w+, (0x[0-9a-f]+)'),\n"
        "                  'deallocs': regs(r'USETMAXREG.DEALLOC.CTAPOOL (0x[0-9a-f]+)')}))\n"
    )
    assert got["stack"] == 0, "spills"
    # Two consumers, each: S with one group (P·V) in flight, then all; plus the last tile's P·V.
    assert got["waits"].count("0x1") == 2
    assert flash_gluon_fwd.CONSUMER_REGS in got["allocs"] and flash_gluon_fwd.PRODUCER_REGS in got["deallocs"]
    assert max(got["allocs"]) + flash_gluon_fwd.CONSUMER_REGS + flash_gluon_fwd.PRODUCER_REGS <= 3 * 168


@pytest.mark.parametrize(("setting", "shape", "causal", "want"), [
    ("", (4, 16, 4096, 128), True, flash_gluon_fwd.DEFAULTS.get((128, True))),
    ("", (4, 16, 8192, 128), False, flash_gluon_fwd.DEFAULTS.get((128, False))),
    ("", (8, 1, 4096, 128), True, None),  # too little work to pay for the Python launch
    ("", (1, 16, 16384, 64), True, None),  # d = 64: the Triton forward
    ("0", (4, 16, 8192, 128), False, None),
    ("64,4,1", (1, 1, 256, 64), True, {"block_n": 64, "stages": 4, "pingpong": True}),
])
def test_the_gluon_forward_runs_where_chosen(monkeypatch, setting, shape, causal, want):
    """`flash_gluon_fwd.chosen`: the defaults at d = 128 on large calls, PROFILER_KIT_FLASH_GLUON_FWD=0 off, a
    named config anywhere the kernel applies."""
    monkeypatch.setattr(flash_gluon_fwd, "usable", lambda *tensors: True)
    monkeypatch.setenv(flash_gluon_fwd.GLUON_ENV, setting)
    q = torch.empty(shape, device="meta")
    assert flash_gluon_fwd.chosen(q, q, q, causal) == want


def test_the_gluon_dkdv_kernel_runs_only_when_named(monkeypatch):
    """`flash_gluon_bwd.chosen_dkdv`: the Triton dK/dV kernel by default (the Gluon one did not win on the issue 6
    shapes), a named config where it applies."""
    monkeypatch.setattr(flash_gluon_bwd, "usable", lambda *tensors: True)
    q = torch.empty((4, 16, 8192, 128), device="meta")
    monkeypatch.delenv(flash_gluon_bwd.DKDV_ENV, raising=False)
    assert flash_gluon_bwd.chosen_dkdv(q, q, q, q, False) is None
    monkeypatch.setenv(flash_gluon_bwd.DKDV_ENV, "64,64,2,4")
    assert flash_gluon_bwd.chosen_dkdv(q, q, q, q, False) == {"block_m": 64, "block_n": 64, "stages": 2,
                                                              "num_warps": 4}


@pytest.mark.parametrize(("head_dim", "config", "in_flight"), [
    (128, {"stages": 2, "defer": False, "block_m": 64}, ["0x1", "0x1"]),
    (64, {"stages": 2, "defer": True, "block_m": 64}, ["0x3", "0x2"]),
    (64, {"stages": 2, "defer": False, "block_m": 128}, ["0x1"]),  # dV waited for with dPᵀ
])
def test_two_group_fused_backward_keeps_its_schedule(compiled_facts, head_dim, config, in_flight):
    """The two-warp-group fused backward (`flash_gluon_fused`): both consumers get CONSUMER_REGS by `setmaxnreg`
    and the producer the rest of the 3 × 168; no spills (causal); each consumer's waits keep matmuls in flight
    (d = 128: q·kᵀ with dPᵀ, dPᵀ with dV; d = 64, deferred: q·kᵀ with three groups, dPᵀ with two; 128-row query
    tiles: q·kᵀ with dPᵀ) instead of one wait after every wgmma, which is what ptxas falls back to when the
    registers run out; dQ leaves by TMA reductions."""
    got = compiled_facts(
        "import json, re\n"
        "from profiler_kit.attention.flash_gluon_fused import compile_sm90\n"
        "from profiler_kit.attention.flash_triton import machine_code\n"
        f"usage, sass = machine_code(compile_sm90({head_dim}, **{config!r}))\n"
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
    assert got["allocs"].count(flash_gluon_fused.CONSUMER_REGS) == 2
    assert 2 * flash_gluon_fused.CONSUMER_REGS + min(got["deallocs"]) <= 3 * flash_gluon_fused.LAUNCH_MAXNREG
    assert [w for w in got["waits"] if w != "0x0"] == 2 * in_flight
    assert len(got["waits"]) <= 10, "a wait after every wgmma: ptxas ran out of registers"
    assert got["reductions"] == 2


@pytest.mark.parametrize(("setting", "shape", "want"), [
    ("", (4, 16, 8192, 128), flash_gluon_fused.DEFAULTS.get(128)),
    ("", (8, 1, 4096, 128), None),  # too little work to pay for the Python launch
    ("", (1, 16, 16384, 64), flash_gluon_fused.DEFAULTS.get(64)),  # the leaderboard
    ("", (8, 1, 4096, 64), None),
    ("0", (4, 16, 8192, 128), None),
    ("2,1", (1, 1, 256, 64), {"stages": 2, "defer": True, "block_m": 64}),
    ("2,0,128", (1, 1, 256, 64), {"stages": 2, "defer": False, "block_m": 128}),
    ("2,1", (1, 1, 256, 128), None),  # not offered at d = 128: it spills
    ("2,0,128", (1, 1, 256, 128), None),
])
def test_the_fused_backward_runs_where_chosen(monkeypatch, setting, shape, want):
    """`flash_gluon_fused.chosen`: the defaults at d = 64 and 128 on large calls, PROFILER_KIT_FLASH_GLUON_BWD=0 off,
    a named config where it is offered."""
    monkeypatch.setattr(flash_gluon_bwd, "usable", lambda *tensors: True)
    monkeypatch.setenv(flash_gluon_fused.BWD_ENV, setting)
    q = torch.empty(shape, device="meta")
    assert flash_gluon_fused.chosen(q, q, q, q) == want
