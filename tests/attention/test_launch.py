"""The launch plumbing of the Triton attention kernels: which calls reuse a resolved launch, and what they pass.

Triton's compiled kernels need a GPU, so here a stand-in kernel records what it is given; the GPU tests in
test_kernels.py run the real direct launches against the autotuned ones.
"""

from __future__ import annotations

import types

import pytest
import torch

from profiler_kit.attention.options import FlashOptions
from profiler_kit.attention.triton_kernels import configs, launcher
from profiler_kit.attention.triton_kernels.launcher import Kernel, tensor_signature


class _Compiled:
    """Stands in for triton.compiler.CompiledKernel: records each launch its launcher receives."""

    function = "function-handle"
    packed_metadata = "packed-metadata"

    def __init__(self) -> None:
        self.launches: list[tuple] = []

    def launch_metadata(self, grid, stream, *args):
        return None

    def run(self, grid_x, grid_y, grid_z, stream, function, packed, metadata, enter_hook, exit_hook, *args):
        assert (stream, function, packed) == ("stream-7", "function-handle", "packed-metadata")
        self.launches.append(((grid_x, grid_y, grid_z), args))


class _JitFunction:
    """Stands in for a @triton.jit function with two runtime and two constexpr parameters."""

    arg_names = ["X", "N", "SCALE", "BLOCK"]

    def __init__(self) -> None:
        self.compiled = _Compiled()
        self.launched: list[tuple] = []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.launched.append((grid, args, kwargs))
            return self.compiled

        return run


@pytest.fixture
def kernel(monkeypatch):
    monkeypatch.setattr(launcher, "INTERPRET", False)
    device = types.SimpleNamespace(get_current_device=lambda: 0, get_current_stream=lambda index: "stream-7")
    monkeypatch.setattr(launcher, "driver", types.SimpleNamespace(active=device))
    return Kernel(_JitFunction())


def _call(kernel: Kernel, n: int, signature, options: FlashOptions | None = None) -> None:
    kernel(lambda meta: (n // 4, 3), ("x-ptr", n), {"SCALE": 2, "BLOCK": 4}, signature, options=options)


def test_second_call_with_a_signature_goes_straight_to_the_compiled_kernel(kernel):
    _call(kernel, 40, "sig-a")
    assert len(kernel.fn.launched) == 1 and kernel.fn.compiled.launches == []
    _call(kernel, 40, "sig-a")
    assert len(kernel.fn.launched) == 1, "the second call went through Triton's dispatch again"
    # Runtime arguments, then the constexprs in the kernel's parameter order; the grid padded to 3 dims.
    assert kernel.fn.compiled.launches == [((10, 3, 1), ("x-ptr", 40, 2, 4))]


def test_each_signature_resolves_its_own_launch(kernel):
    _call(kernel, 40, "sig-a")
    _call(kernel, 80, "sig-b")  # e.g. another length: another grid, perhaps another specialisation
    assert len(kernel.fn.launched) == 2
    _call(kernel, 80, "sig-b")
    assert kernel.fn.compiled.launches == [((20, 3, 1), ("x-ptr", 80, 2, 4))]


def test_no_signature_or_direct_launch_off_always_dispatches_through_triton(kernel):
    _call(kernel, 40, None)
    _call(kernel, 40, None)
    _call(kernel, 40, "sig-a", FlashOptions(direct_launch=False))
    _call(kernel, 40, "sig-a", FlashOptions(direct_launch=False))
    assert len(kernel.fn.launched) == 4 and kernel.fn.compiled.launches == []


def test_planned_launch_takes_only_the_per_call_arguments(kernel):
    """The launchers' short path: once a signature has a plan, a call passes its leading (tensor) arguments
    only, and the integers and constexprs the signature fixes come from the plan."""
    options = FlashOptions()
    assert kernel.planned("sig-a", ("y-ptr",), options) is None, "no plan yet: nothing may launch"
    assert kernel.fn.launched == [] and kernel.fn.compiled.launches == []
    _call(kernel, 40, "sig-a")
    plan = kernel.planned("sig-a", ("y-ptr",), options)
    assert plan is not None and plan.per_call == 1 and plan.record.launches == ()
    assert kernel.fn.compiled.launches == [((10, 3, 1), ("y-ptr", 40, 2, 4))]
    assert kernel.planned("sig-b", ("y-ptr",), options) is None
    assert kernel.planned("sig-a", ("y-ptr",), FlashOptions(direct_launch=False)) is None
    assert len(kernel.fn.compiled.launches) == 1 and len(kernel.fn.launched) == 1


def test_tensor_signature_sees_what_triton_specialises_on():
    base = torch.zeros(2 * 64 * 32 + 1, dtype=torch.float16)
    aligned = base[: 2 * 64 * 32].view(2, 64, 32)
    assert tensor_signature(aligned) == tensor_signature(torch.ones(2, 64, 32, dtype=torch.float16))
    others = [
        base[1:].view(2, 64, 32),  # the same shape one element in: no longer 16-byte aligned
        aligned.float(),
        aligned.transpose(0, 1),
        aligned[:, :48],  # a shorter sequence with the same strides
    ]
    for other in others:
        assert tensor_signature(other) != tensor_signature(aligned)


def test_config_tuples_name_their_flags():
    params = ["Q", "BLOCK_M", "BLOCK_N", "WS", "HEAD_FIRST", "OVERLAP"]
    plain, flagged = configs.configs([(128, 64, 8, 3), (64, 64, 4, 4, "head_first", "overlap")], params)
    assert plain.kwargs == {"BLOCK_M": 128, "BLOCK_N": 64, "WS": False, "HEAD_FIRST": False, "OVERLAP": False}
    assert (plain.num_warps, plain.num_stages) == (8, 3)
    assert flagged.kwargs == {"BLOCK_M": 64, "BLOCK_N": 64, "WS": False, "HEAD_FIRST": True, "OVERLAP": True}
    # A kernel without OVERLAP gets no such constexpr, and may not be offered the flag.
    assert configs.configs([(128, 64, 8, 3)], params[:-1])[0].kwargs == {
        "BLOCK_M": 128, "BLOCK_N": 64, "WS": False, "HEAD_FIRST": False}
    with pytest.raises(ValueError, match="not offered"):
        configs.configs([(128, 64, 8, 3, "overlap")], params[:-1])
    with pytest.raises(ValueError, match="not offered"):
        configs.configs([(64, 64, 4, 4, True)], params)  # the old positional booleans are refused
    capped = configs.configs([(64, 64, 4, 3, "overlap", "maxnreg=168")], params)[0]
    assert (capped.maxnreg, capped.kwargs["OVERLAP"], plain.maxnreg) == (168, True, None)
