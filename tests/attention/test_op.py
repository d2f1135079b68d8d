"""The FlashAttention operators (`torch.ops.profiler_kit.flash_attention*`): torch.library's own checks, gradients
against a float64 reference, eagerly and compiled with fullgraph=True, and what torch.compile traces on CUDA.

On the CPU the operators run the tiled PyTorch reference; the graph a CUDA trace makes is checked here on fake
CUDA tensors, which need no GPU; the `gpu` tests run the kernels compiled by Inductor. `flash_attention` is the
operator under torch.compile and the autograd Function eagerly (the Triton interpreter on the CPU).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from profiler_kit.attention import AttentionInputError, flash_attention, flash_options, launch_record
from profiler_kit.attention.op import flash_attention_op
from profiler_kit.model import TransformerLM
from profiler_kit.presets import from_name

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
REPO = Path(__file__).resolve().parents[2]
OPS = torch.ops.profiler_kit
# Largest error relative to the largest magnitude of the float64 reference, for fp32 inputs: fp32 arithmetic
# on the CPU; on CUDA the kernels run fp32 matmuls in TF32 (10-bit mantissa).
TOLERANCE = {"cpu": 1e-5, "cuda": 1e-2}


@pytest.fixture(autouse=True)
def one_config_per_kernel():
    """On CUDA, the first config that fits instead of autotuning, eagerly and in Inductor (autotuning compiles
    every config of every kernel: minutes)."""
    with flash_options(autotune=False):
        yield


def _qkv(lead=(2, 3), n_q=40, n_k=56, d=16, dtype=torch.float32, requires_grad=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shapes = ((*lead, n_q, d), (*lead, n_k, d), (*lead, n_k, d))
    return [torch.randn(s, generator=gen, dtype=dtype).to(DEVICE).requires_grad_(requires_grad) for s in shapes]


def _reference(q, k, v, causal):
    """Attention in float64 with the top-left causal alignment the operators use (as SDPA's is_causal)."""
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)


def _assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    err = (got.double() - want.double()).abs().max().item()
    assert err <= TOLERANCE[DEVICE] * want.abs().max().item(), err


@pytest.mark.parametrize("causal", [True, False])
def test_operators_pass_opcheck(causal):
    q, k, v = _qkv()
    # opcheck compares eager results with traced ones; on CUDA these may run other tile configs (TF32 sums).
    tolerance = {} if DEVICE == "cpu" else {"atol": 1e-2, "rtol": 1e-2}
    for operator in (flash_attention_op.default, OPS.flash_attention_forward.default):
        torch.library.opcheck(operator, (q, k, v, causal), **tolerance)
    out, lse = OPS.flash_attention_forward(q, k, v, causal)
    grad_out = torch.randn_like(out)
    backward_args = (*(t.detach() for t in (q, k, v, out, lse)), grad_out, causal)
    torch.library.opcheck(OPS.flash_attention_backward.default, backward_args, **tolerance)


def test_forward_returns_the_logsumexp_of_each_query_row():
    q, k, v = _qkv(requires_grad=False)
    out, lse = OPS.flash_attention_forward(q, k, v, True)
    scores = (q.double() @ k.double().transpose(-2, -1)) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(torch.ones(40, 56, dtype=torch.bool, device=DEVICE).triu(1), float("-inf"))
    assert lse.shape == q.shape[:-1] and lse.dtype == torch.float32
    _assert_close(lse, torch.logsumexp(scores, dim=-1))
    _assert_close(out, _reference(q, k, v, True))


@pytest.mark.parametrize("causal", [True, False])
def test_gradients_match_float64_reference(causal):
    q, k, v = _qkv()
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    out = flash_attention_op(q, k, v, causal)
    got = torch.autograd.grad(out, (q, k, v), grad_out)
    want = torch.autograd.grad(_reference(q, k, v, causal), (q, k, v), grad_out.double())
    _assert_close(out, _reference(q, k, v, causal))
    for g, w in zip(got, want, strict=True):
        _assert_close(g, w)


def test_compiled_fullgraph_gradients_match_float64_reference():
    """A function calling `flash_attention` compiles to one graph holding the operator (Inductor) and
    differentiates like float64."""
    from torch._inductor.compile_fx import compile_fx

    graphs = []

    def inductor(gm, example_inputs):
        graphs.append(gm)
        return compile_fx(gm, example_inputs)

    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 64, 32, generator=gen).to(DEVICE)
    weights = [(torch.randn(32, 32, generator=gen) / 32**0.5).to(DEVICE).requires_grad_() for _ in range(3)]

    def block(x, wq, wk, wv, attention):
        split = lambda t: t.view(2, 64, 2, 16).transpose(1, 2)  # noqa: E731 - two heads of 16
        return attention(split(x @ wq), split(x @ wk), split(x @ wv)).square().sum()

    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, backend=inductor)
    loss = compiled(x, *weights, lambda q, k, v: flash_attention(q, k, v, True))
    assert "torch.ops.profiler_kit.flash_attention" in graphs[0].code
    got = torch.autograd.grad(loss, weights)
    x64, w64 = x.double(), [w.detach().double().requires_grad_() for w in weights]
    want_loss = block(x64, *w64, lambda q, k, v: _reference(q, k, v, True))
    want = torch.autograd.grad(want_loss, w64)
    _assert_close(loss, want_loss)
    for g, w in zip(got, want, strict=True):
        _assert_close(g, w)


def test_model_with_flash_compiles_fullgraph_and_matches_eager():
    torch.manual_seed(0)
    model = TransformerLM(from_name("tiny", 64), attention="flash").to(DEVICE)
    tokens = torch.randint(0, model.cfg.vocab_size, (2, 64), device=DEVICE)

    def grads(forward):
        model.zero_grad(set_to_none=True)
        forward(tokens).float().square().mean().backward()
        return [p.grad.clone() for p in model.parameters()]

    torch._dynamo.reset()
    eager = grads(model)
    compiled = grads(torch.compile(model, fullgraph=True, backend="aot_eager"))
    for g, w in zip(compiled, eager, strict=True):
        _assert_close(g, w)


def test_operator_checks_its_inputs():
    q, k, v = _qkv(d=8, requires_grad=False)
    with pytest.raises(AttentionInputError, match="head dim 8"):
        flash_attention_op(q, k, v, False)


_TRACE_ON_FAKE_CUDA = """
import torch
import triton
from torch._functorch.aot_autograd import aot_function
from torch._subclasses.fake_tensor import FakeTensorMode
from triton.backends.compiler import GPUTarget

from profiler_kit.attention import op


class Sm90:  # the one driver query of a trace: the target that Triton lowers the kernels for
    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)


def fwd_bwd(q, k, v, do):
    out, lse = torch.ops.profiler_kit.flash_attention_forward(q, k, v, True)
    return torch.ops.profiler_kit.flash_attention_backward(q, k, v, out, lse, do, True)


def show(gm, _):
    print(gm.code)
    raise SystemExit(0)


triton.runtime.driver.set_active(Sm90())
with FakeTensorMode():
    q, k, v, do = (torch.empty(2, 4, 256, 80, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    aot_function(fwd_bwd, fw_compiler=show)(q, k, v, do)
"""


@pytest.mark.skipif(DEVICE == "cuda", reason="checks the CUDA trace on fake tensors, for machines without a GPU")
def test_cuda_trace_holds_the_triton_kernels():
    """Traced by AOTAutograd on CUDA (fake) tensors, the operators become the four Triton launches themselves,
    with pointer loads, each writing only the tensors it allocates (Triton's sm_90 lowering tells which), so
    that the compiled graph copies no input. Runs without TRITON_INTERPRET, which would turn the kernels into
    interpreted ones."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRITON_INTERPRET": "0"}
    proc = subprocess.run([sys.executable, "-c", _TRACE_ON_FAKE_CUDA], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    launches = [line for line in proc.stdout.splitlines() if "triton_kernel_wrapper_functional(" in line]
    written = [line[line.index("tensors_to_clone = ["):].split("]")[0] + "]" for line in launches]
    assert written == ["tensors_to_clone = ['Out', 'L']", "tensors_to_clone = ['Delta', 'LSE2']",
                       "tensors_to_clone = ['DK', 'DV']", "tensors_to_clone = ['DQ']"], proc.stdout
    assert all("'TMA': False" in line for line in launches[:1] + launches[2:])
    assert "profiler_kit.flash_attention" not in proc.stdout  # decomposed, not an opaque call


@pytest.mark.gpu
@pytest.mark.gpu_slow  # torch.compile
def test_compiled_graph_on_cuda_runs_the_triton_kernels():
    """Compiled with fullgraph=True on CUDA, forward and backward launch the Triton kernels from Inductor's code
    and give the float64 reference's output and gradients (bf16: 3% of the largest magnitude)."""
    from torch._inductor.utils import run_and_get_code

    q, k, v = _qkv(lead=(2, 4), n_q=256, n_k=256, d=64, dtype=torch.bfloat16)
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE, torch.bfloat16)
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: flash_attention_op(q, k, v, True), fullgraph=True)

    def step():
        out = compiled(q, k, v)
        out.backward(grad_out)
        return out

    out, code = run_and_get_code(step)
    source = "\n".join(code)
    for kernel in ("_flash_attn_fwd_kernel", "_flash_attn_bwd_dkdv_kernel", "_flash_attn_bwd_dq_kernel"):
        assert kernel in source
    want = _reference(q, k, v, True)
    want_grads = torch.autograd.grad(want, (q, k, v), grad_out.double())
    for got, ref in zip((out, q.grad, k.grad, v.grad), (want, *want_grads), strict=True):
        err = (got.double() - ref).abs().max().item()
        assert err <= 3e-2 * ref.abs().max().item(), err


@pytest.mark.gpu
@pytest.mark.gpu_slow  # autotunes
def test_eager_operator_keeps_the_launch_record():
    q, k, v = _qkv(lead=(2, 4), n_q=256, n_k=256, d=64, dtype=torch.bfloat16)
    out = flash_attention_op(q, k, v, True)
    assert [launch.kernel for launch in launch_record(out).launches] == ["fwd"]
    out.sum().backward()
    assert [launch.kernel for launch in launch_record(out).launches][-1] == "dq"
