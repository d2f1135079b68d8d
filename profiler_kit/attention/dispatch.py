"""Which kernels a flash attention call runs, by device, dtype, head dim and size: the one place that chooses.

- `flash_attention` runs the Triton path on CUDA and under the Triton interpreter (not in bf16, which the
  interpreter cannot compute), and the tiled PyTorch reference elsewhere (`triton_runs`).
- The forward runs the Gluon FA3-style kernel (`gluon_kernels.fwd`) at d = 128 on large calls, the Triton kernel
  (`triton_kernels.fwd`) otherwise (`gluon_forward_config`).
- The backward runs the D pre-pass, then the fused two-warp-group Gluon kernel (`gluon_kernels.bwd`) at d = 64
  (128-row query tiles) and d = 128 on large calls, the split Triton dK/dV and dQ kernels otherwise
  (`gluon_backward_config`).
- The Triton kernels move tiles by TMA descriptors on large calls and through pointers on small ones
  (`triton_tma`): each launch converts every descriptor into a tensor map on the host, time that only a large
  call's GPU work hides.

Calls that torch.compile traces (through the operators of `op`) run the Triton kernels only, which the compiled
graph can hold.

"Large" is at least MIN_WORK of Z·H·N_Q·N_K·d: the Gluon kernels launch through Triton's Python dispatch and
TMA descriptors cost host time at every launch, which the GPU work must hide. `FlashOptions` can turn either
Gluon kernel on wherever it can run, off, or pin its config. docs/attention.md has the timings behind these defaults.
"""

from __future__ import annotations

import math

import torch

from profiler_kit.attention.gluon_kernels import bwd as gluon_bwd
from profiler_kit.attention.gluon_kernels import fwd as gluon_fwd
from profiler_kit.attention.gluon_kernels.common import usable
from profiler_kit.attention.options import INTERPRET, FlashOptions, GluonBackwardConfig, GluonForwardConfig
from profiler_kit.attention.record import LaunchRecord
from profiler_kit.attention.triton_kernels import bwd as triton_bwd
from profiler_kit.attention.triton_kernels import fwd as triton_fwd
from profiler_kit.attention.triton_kernels.launcher import tma_usable

# The Gluon forward's config per (head dim, causal) on large calls; the Triton forward elsewhere.
GLUON_FORWARD_DEFAULTS: dict[tuple[int, bool], GluonForwardConfig] = {
    (128, causal): GluonForwardConfig(block_n=128, stages=3, pingpong=False) for causal in (False, True)
}
# The fused Gluon backward's config per head dim on large calls; the split Triton backward elsewhere.
GLUON_BACKWARD_DEFAULTS: dict[int, GluonBackwardConfig] = {
    64: GluonBackwardConfig(stages=2, defer=False, block_m=128),
    128: GluonBackwardConfig(stages=2, defer=False, block_m=64),
}
# Work (Z·H·N_Q·N_K·d) from which the Gluon kernels run by default.
MIN_WORK = 1e11


def triton_runs(q: torch.Tensor) -> bool:
    """Whether `flash_attention` takes the Triton path for `q`: CUDA, or the interpreter outside bf16."""
    return q.device.type == "cuda" or (INTERPRET and q.dtype != torch.bfloat16)


def _large(q4: torch.Tensor, k4: torch.Tensor) -> bool:
    z, h, n_q, d = q4.shape
    return z * h * n_q * k4.shape[2] * d >= MIN_WORK


def triton_tma(q4: torch.Tensor, k4: torch.Tensor, *tensors: torch.Tensor) -> bool:
    """Whether the Triton kernels of an eager call move tiles by TMA: large calls whose tensors allow it."""
    return not INTERPRET and _large(q4, k4) and tma_usable(q4, k4, *tensors)


def gluon_forward_config(q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, causal: bool,
                         options: FlashOptions) -> GluonForwardConfig | None:
    """The Gluon forward's config for this call, or None where the Triton forward runs."""
    if options.gluon_forward == "off":
        return None
    default = GLUON_FORWARD_DEFAULTS.get((q4.shape[-1], causal))
    if options.gluon_forward == "auto" and (default is None or not _large(q4, k4)):
        return None
    config = options.gluon_forward_config or default or GluonForwardConfig()
    # Asked last: it queries the device, and this runs on every forward.
    return config if usable(q4, k4, v4) else None


def gluon_backward_config(q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, do4: torch.Tensor,
                          options: FlashOptions) -> GluonBackwardConfig | None:
    """The fused Gluon backward's config for this call, or None where the split Triton backward runs (also
    where a pinned config is not offered at this head dim, `gluon_kernels.bwd.CONFIGS`)."""
    if options.gluon_backward == "off":
        return None
    d = q4.shape[-1]
    default = GLUON_BACKWARD_DEFAULTS.get(d)
    if options.gluon_backward == "auto" and (default is None or not _large(q4, k4)):
        return None
    config = options.gluon_backward_config or default
    if config not in gluon_bwd.CONFIGS.get(d, []):
        return None
    return config if usable(q4, k4, v4, do4) else None


def forward(q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, causal: bool, options: FlashOptions,
            traced: bool = False) -> tuple[torch.Tensor, torch.Tensor, LaunchRecord]:
    """O, the fp32 L (Z·H, N_Q) and the launch record of a forward over (Z, H, seq, d) views. `traced`
    (torch.compile is tracing the call, `op`): the Triton kernel, which the compiled graph can hold."""
    config = None if traced else gluon_forward_config(q4, k4, v4, causal, options)
    if config is not None:
        return gluon_fwd.forward(q4, k4, v4, causal, config)
    tma = not traced and triton_tma(q4, k4, v4)
    return triton_fwd.flash_forward(q4, k4, v4, causal, tma=tma, options=options, traced=traced)


def backward(q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, o4: torch.Tensor, lse: torch.Tensor,
             do4: torch.Tensor, causal: bool, options: FlashOptions,
             traced: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, LaunchRecord]:
    """dQ, dK, dV (contiguous (Z, H, seq, d), the input dtype) and the launch record of a backward. `traced`
    as in `forward`: the split Triton kernels."""
    config = None if traced else gluon_backward_config(q4, k4, v4, do4, options)
    if config is None:
        tma = not traced and triton_tma(q4, k4, v4, do4)
        return triton_bwd.flash_backward(q4, k4, v4, o4, lse, do4, causal, tma=tma, options=options,
                                         traced=traced)
    z, h, n_q, d = q4.shape
    n_k = k4.shape[2]
    tma = not INTERPRET and tma_usable(q4, k4, v4, do4)
    signature = triton_bwd.backward_signature(causal, tma, q4, k4, v4, o4, do4, lse)
    lse2, delta = triton_bwd.statistics(o4, do4, lse, signature, options)
    dq_acc = torch.zeros((z * h * n_q, d), dtype=torch.float32, device=q4.device)
    dk = torch.empty((z, h, n_k, d), dtype=k4.dtype, device=k4.device)
    dv = torch.empty_like(dk)
    record = gluon_bwd.fused(q4, k4, v4, do4, lse2, delta, dq_acc, dk, dv, causal, config)
    dq = torch.empty((z, h, n_q, d), dtype=q4.dtype, device=q4.device)
    torch.mul(dq_acc.view(z, h, n_q, d), 1.0 / math.sqrt(d), out=dq)
    return dq, dk, dv, record
