"""Which kernels a call runs (`dispatch`), and the options object that changes it (`options`)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from profiler_kit.attention import dispatch
from profiler_kit.attention.options import (
    FlashOptions,
    GluonBackwardConfig,
    GluonForwardConfig,
    current_options,
    flash_options,
)


@pytest.fixture
def gluon_usable(monkeypatch):
    """Every call qualifies for the Gluon kernels, as on an H100 with Gluon."""
    monkeypatch.setattr(dispatch, "usable", lambda *tensors: True)


@pytest.mark.usefixtures("gluon_usable")
@pytest.mark.parametrize(("options", "shape", "causal", "want"), [
    (FlashOptions(), (4, 16, 4096, 128), True, GluonForwardConfig(128, 3, False)),
    (FlashOptions(), (4, 16, 8192, 128), False, GluonForwardConfig(128, 3, False)),
    (FlashOptions(), (8, 1, 4096, 128), True, None),  # too little work to pay for the Python launch
    (FlashOptions(), (1, 16, 16384, 64), True, None),  # d = 64: the Triton forward
    (FlashOptions(gluon_forward="off"), (4, 16, 8192, 128), False, None),
    (FlashOptions(gluon_forward="on", gluon_forward_config=GluonForwardConfig(64, 4, True)), (1, 1, 256, 64), True,
     GluonForwardConfig(64, 4, True)),
    (FlashOptions(gluon_forward="on"), (1, 1, 256, 128), False, GluonForwardConfig(128, 3, False)),
])
def test_the_gluon_forward_runs_where_chosen(options, shape, causal, want):
    """The defaults at d = 128 on large calls, "off" never, "on" with a config anywhere the kernel applies."""
    q = torch.empty(shape, device="meta")
    assert dispatch.gluon_forward_config(q, q, q, causal, options) == want


@pytest.mark.usefixtures("gluon_usable")
@pytest.mark.parametrize(("options", "shape", "want"), [
    (FlashOptions(), (4, 16, 8192, 128), GluonBackwardConfig(2, False, 64)),
    (FlashOptions(), (8, 1, 4096, 128), None),  # too little work to pay for the Python launch
    (FlashOptions(), (1, 16, 16384, 64), GluonBackwardConfig(2, False, 128)),  # the leaderboard
    (FlashOptions(), (8, 1, 4096, 64), None),
    (FlashOptions(gluon_backward="off"), (4, 16, 8192, 128), None),
    (FlashOptions(gluon_backward="on", gluon_backward_config=GluonBackwardConfig(2, True, 64)), (1, 1, 256, 64),
     GluonBackwardConfig(2, True, 64)),
    (FlashOptions(gluon_backward="on", gluon_backward_config=GluonBackwardConfig(2, False, 128)), (1, 1, 256, 64),
     GluonBackwardConfig(2, False, 128)),
    # Not offered at d = 128 (it spills): the split backward runs.
    (FlashOptions(gluon_backward="on", gluon_backward_config=GluonBackwardConfig(2, True, 64)), (1, 1, 256, 128),
     None),
    (FlashOptions(gluon_backward="on", gluon_backward_config=GluonBackwardConfig(2, False, 128)),
     (1, 1, 256, 128), None),
])
def test_the_fused_backward_runs_where_chosen(options, shape, want):
    """The defaults at d = 64 and 128 on large calls, "off" never, a pinned config where it is offered."""
    q = torch.empty(shape, device="meta")
    assert dispatch.gluon_backward_config(q, q, q, q, options) == want


@pytest.mark.parametrize(("shape", "usable", "want"), [
    ((4, 16, 4096, 128), True, True),  # large: tiles by TMA
    ((4, 25, 512, 64), True, False),  # a model's call at ctx 512: pointers, no descriptors to build
    ((4, 16, 8192, 128), False, False),  # large, but the tensors do not allow TMA
])
def test_triton_kernels_use_tma_on_large_calls_only(monkeypatch, shape, usable, want):
    monkeypatch.setattr(dispatch, "INTERPRET", False)
    monkeypatch.setattr(dispatch, "tma_usable", lambda *tensors: usable)
    q = torch.empty(shape, device="meta")
    assert dispatch.triton_tma(q, q, q) == want


def test_gluon_kernels_need_a_hopper_gpu():
    """On the CPU (or the interpreter) the Gluon kernels never run, whatever the options ask."""
    q = torch.empty(4, 16, 8192, 128, dtype=torch.bfloat16)
    on = FlashOptions(gluon_forward="on", gluon_backward="on")
    assert dispatch.gluon_forward_config(q, q, q, True, on) is None
    assert dispatch.gluon_backward_config(q, q, q, q, on) is None


def test_flash_options_nest_and_restore():
    assert current_options() == FlashOptions()
    with flash_options(autotune=False) as outer:
        assert current_options() is outer and not outer.autotune
        with flash_options(gluon_forward="off") as inner:
            assert not inner.autotune and inner.gluon_forward == "off"
        assert current_options() is outer
    assert current_options() == FlashOptions()


def test_flash_options_are_frozen_and_checked():
    with pytest.raises(dataclasses.FrozenInstanceError):
        FlashOptions().autotune = False  # type: ignore[misc]
    with pytest.raises(ValueError, match="gluon_forward must be one of auto, on, off"):
        FlashOptions(gluon_forward="yes")  # type: ignore[arg-type]
