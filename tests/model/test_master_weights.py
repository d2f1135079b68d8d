"""AdamW on fp32 master weights (`--optimizer adamw-master`): the update against torch.optim.AdamW in float64,
the Triton kernel (interpreted on a CPU, compiled on a GPU) against the PyTorch path, and the workload."""

from __future__ import annotations

import pytest
import torch

from profiler_kit import master_weights
from profiler_kit.errors import ProfilerKitError
from profiler_kit.master_weights import MasterWeightAdamW
from profiler_kit.workload import Workload, WorkloadConfig

SETTINGS = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
# Odd sizes (not a multiple of the kernel's vector width), one past a chunk, and a multiple of it.
SHAPES = [(7, 3), (master_weights.BLOCK + 1,), (2, master_weights.BLOCK), (5,)]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _params(device: str, seed: int = 0) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=generator).to(device)) for shape in SHAPES]


def _grads(step: int, weight_dtype: torch.dtype, device: str) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + step)
    return [torch.randn(shape, generator=generator).to(device, weight_dtype) for shape in SHAPES]


def _run(params: list[torch.nn.Parameter], weight_dtype: torch.dtype, use_triton: bool, steps: int = 3,
         skip: int | None = None) -> MasterWeightAdamW:
    optimizer = MasterWeightAdamW(params, weight_dtype=weight_dtype, use_triton=use_triton, **SETTINGS)
    for step in range(steps):
        for i, (p, g) in enumerate(zip(params, _grads(step, weight_dtype, params[0].device.type), strict=True)):
            p.grad = None if i == skip else g
        optimizer.step()
    return optimizer


def _reference(device: str, steps: int = 3, skip: int | None = None) -> list[torch.Tensor]:
    """torch.optim.AdamW in float64 on the same starting weights and the same gradients."""
    params = [torch.nn.Parameter(p.detach().double()) for p in _params(device)]
    optimizer = torch.optim.AdamW(params, foreach=False, **SETTINGS)
    for step in range(steps):
        for i, (p, g) in enumerate(zip(params, _grads(step, torch.bfloat16, device), strict=True)):
            p.grad = None if i == skip else g.double()
        optimizer.step()
    return [p.detach() for p in params]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("triton_path", [False, True], ids=["torch", "triton"])
def test_the_update_is_adamw_on_the_master_weights(device, triton_path):
    """Master weights follow float64 AdamW fed the same bf16 gradients; the model's weights are their bf16
    roundings; a parameter without a gradient is left as it was."""
    if triton_path and device == "cpu" and not master_weights.INTERPRET:
        pytest.skip("the Triton kernel runs on a CPU only under TRITON_INTERPRET=1")
    params = _params(device)
    start = [p.detach().clone() for p in params]
    optimizer = _run(params, torch.bfloat16, triton_path, skip=3)
    want = _reference(device, skip=3)
    for p, expected in zip(params, want, strict=True):
        master = optimizer.state[p]["master"]
        assert p.dtype == torch.bfloat16 and master.dtype == torch.float32 and master.shape == p.shape
        narrowed = [master.to(torch.bfloat16)]
        if device == "cpu" and triton_path:  # the interpreter narrows what the kernel writes toward zero
            narrowed.append((master.view(torch.int32) >> 16).to(torch.int16).view(torch.bfloat16))
        assert any(torch.equal(p, n) for n in narrowed)
        torch.testing.assert_close(master.double(), expected, rtol=1e-5, atol=1e-6)
    assert torch.equal(optimizer.state[params[3]]["master"], start[3]), "a parameter without a gradient moved"


@pytest.mark.parametrize("device", DEVICES)
def test_the_kernel_and_the_torch_path_agree(device):
    if device == "cpu" and not master_weights.INTERPRET:
        pytest.skip("the Triton kernel runs on a CPU only under TRITON_INTERPRET=1")
    kernel, torch_path = (_run(_params(device), torch.float16, use_triton) for use_triton in (True, False))
    for name in ("master", "exp_avg", "exp_avg_sq"):
        torch.testing.assert_close(getattr(kernel, name), getattr(torch_path, name), rtol=2e-6, atol=1e-7)


def test_bad_parameter_sets_are_refused():
    with pytest.raises(ValueError, match="one device"):
        MasterWeightAdamW([torch.nn.Parameter(torch.zeros(3, dtype=torch.int64), requires_grad=False)])
    with pytest.raises(ValueError, match="empty parameter list"):
        MasterWeightAdamW([])


def test_the_workload_trains_bf16_weights_like_fp32_ones():
    """`--optimizer adamw-master`: the model holds bf16 weights, and its losses follow the fp32-weight recipe's;
    it needs bf16 autocast and one device."""
    def losses(optimizer: str) -> tuple[list[float], set[torch.dtype]]:
        workload = Workload(WorkloadConfig("tiny", 32, mixed_precision=True, optimizer=optimizer, device="cpu"))
        return [float(workload.step()) for _ in range(5)], {p.dtype for p in workload.model.parameters()}

    master, master_dtypes = losses("adamw-master")
    fp32, fp32_dtypes = losses("adamw")
    assert master_dtypes == {torch.bfloat16} and fp32_dtypes == {torch.float32}
    assert master[-1] < master[0]
    assert master == pytest.approx(fp32, rel=2e-3)
    with pytest.raises(ProfilerKitError, match="--mixed-precision"):
        WorkloadConfig("tiny", 32, optimizer="adamw-master").validate()
    with pytest.raises(ProfilerKitError, match="one device"):
        WorkloadConfig("tiny", 32, mixed_precision=True, optimizer="adamw-master", parallel="ddp").validate()
