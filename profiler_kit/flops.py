"""Model FLOPs per step and the per-GPU peak table behind MFU.

FLOP formula (matmuls only; norms, activations, softmax and the optimizer are a few percent and left out, as
in Kaplan et al. 2020 §2.1 and Chinchilla App. F). Per layer and token, forward: QKV projection 2·3d², output
projection 2·d², SwiGLU 2·3·d·d_ff, attention scores QKᵀ 2·T·d and probabilities·V 2·T·d. Attention counts the
full T×T product, which is what naive attention and SDPA's math path compute (a causal flash kernel skips about half;
its own benchmark counts that separately). Plus the LM head 2·d·V per token. Backward is twice the forward (grads
w.r.t. inputs and weights), so forward+backward (and a train step) is three times the forward.

Peaks are dense (no sparsity) rates in TFLOP/s from NVIDIA's datasheets, which print tensor-core rates with 2:4
sparsity (marked with an asterisk): the dense rate is half of those. bf16, fp16 and tf32 are tensor-core rates with
fp32 accumulation (what PyTorch's matmuls use); fp32 is the plain CUDA-core rate. Sources: H100 SXM5 and PCIe (H100
datasheet and Hopper whitepaper), H200 SXM (H200 datasheet; the same compute as H100 SXM), A100 (A100 datasheet; SXM
and PCIe alike), L4 (L4 datasheet), B200 (HGX B200 datasheet, per GPU at 1000 W), L40S and RTX 4090 (Ada datasheet
and whitepaper; the 4090's fp16 rate with fp32 accumulation is half its fp16-accumulate rate). fp32 runs use the
fp32 figure: PyTorch keeps `allow_tf32` off for matmuls by default.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from profiler_kit.presets import ModelConfig

# Backward computes gradients w.r.t. both activations and weights: 2× the forward's matmul FLOPs.
BACKWARD_FACTOR = 2.0


def forward_flops(cfg: ModelConfig, batch_size: int, ctx: int) -> float:
    """Matmul FLOPs of one forward pass over `batch_size` sequences of `ctx` tokens."""
    d, f, v = cfg.d_model, cfg.d_ff, cfg.vocab_size
    per_token_layer = 2 * (3 * d * d) + 2 * (d * d) + 2 * (3 * d * f) + 2 * (2 * ctx * d)
    per_token = cfg.num_layers * per_token_layer + 2 * d * v
    return float(batch_size * ctx * per_token)


def step_flops(cfg: ModelConfig, batch_size: int, ctx: int, mode: str) -> float:
    """FLOPs of one benchmark step in `mode` (forward, forward-backward or train)."""
    fwd = forward_flops(cfg, batch_size, ctx)
    return fwd if mode == "forward" else fwd * (1 + BACKWARD_FACTOR)


@dataclass(frozen=True)
class GpuPeak:
    name: str
    pattern: str  # regex on torch.cuda.get_device_name()
    bf16_tflops: float
    fp16_tflops: float
    tf32_tflops: float
    fp32_tflops: float


# Ordered: the first pattern that matches the device name wins (PCIe before the generic H100 entry).
GPU_PEAKS: tuple[GpuPeak, ...] = (
    GpuPeak("H100 PCIe", r"H100.*PCIe", 756.0, 756.0, 378.0, 51.2),
    GpuPeak("H100 SXM", r"H100", 989.4, 989.4, 494.7, 66.9),
    GpuPeak("H200", r"H200", 989.4, 989.4, 494.7, 66.9),
    GpuPeak("A100", r"A100", 312.0, 312.0, 156.0, 19.5),
    GpuPeak("B200", r"B200", 2250.0, 2250.0, 1100.0, 80.0),
    GpuPeak("L40S", r"L40S", 362.05, 362.05, 183.0, 91.6),
    GpuPeak("L4", r"\bL4\b", 121.0, 121.0, 60.0, 30.3),
    GpuPeak("RTX 4090", r"4090", 165.2, 165.2, 82.6, 82.6),
)


def gpu_peak(device_name: str | None) -> GpuPeak | None:
    if not device_name:
        return None
    for peak in GPU_PEAKS:
        if re.search(peak.pattern, device_name, flags=re.IGNORECASE):
            return peak
    return None


def mfu_pct(achieved_tflops: float, device_name: str | None, mixed_precision: bool) -> float | None:
    """Model FLOPs utilisation in percent, or None when the device's peak is unknown (CPUs, unlisted GPUs)."""
    peak = gpu_peak(device_name)
    if peak is None:
        return None
    return 100.0 * achieved_tflops / (peak.bf16_tflops if mixed_precision else peak.fp32_tflops)
