"""flops.py against numbers computed without it: torch's FLOP counter on the real model, each preset's FLOPs per
step worked out from the architecture, the attention benchmark's causal counting, and the GPU peak table against
NVIDIA's datasheet figures."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from profiler_kit.attention.bench import attention_flops
from profiler_kit.flops import gpu_peak, mfu_pct, step_flops
from profiler_kit.model import TransformerLM
from profiler_kit.presets import PRESETS, from_name

# Forward matmul FLOPs of a batch of B sequences of T tokens, written as 2 FLOPs per multiply-add per weight of
# every matmul (per layer: QKV and output projections 4·d², SwiGLU's three d×d_ff matrices 3·d·d_ff; the LM head
# d·V; not the embedding, a lookup) plus attention's QKᵀ and P·V, 2·T·d each per token and layer, over the full
# T×T square: fwd = 2·B·T·(L·(4d² + 3·d·d_ff) + d·V) + 4·B·L·T²·d. A train step is 3× that (backward 2×).
# At B = 4, T = 256, V = 10000, by preset: (matmul weights, forward FLOPs).
PRESET_FORWARD = {
    # tiny: 2·(4·64² + 3·64·256) + 64·10000 = 771072 weights
    "tiny": (771_072, 1_713_373_184),
    "small": (120_926_208, 257_320_550_400),
    "medium": (412_893_184, 871_375_044_608),
    "large": (956_518_400, 2_007_268_065_280),
    "xl": (1_982_080_000, 4_139_830_476_800),
    "2.7B": (3_381_043_200, 7_010_275_819_520),
}


@pytest.mark.parametrize("name", list(PRESET_FORWARD))
def test_preset_flops_per_step(name):
    d, f, layers = PRESETS[name].d_model, PRESETS[name].d_ff, PRESETS[name].num_layers
    weights, forward = PRESET_FORWARD[name]
    assert layers * (4 * d * d + 3 * d * f) + d * 10_000 == weights
    cfg = from_name(name, 256)
    assert step_flops(cfg, 4, 256, "forward") == forward
    assert step_flops(cfg, 4, 256, "train") == 3 * forward
    assert step_flops(cfg, 4, 256, "forward-backward") == 3 * forward


def test_tiny_model_flops_match_torchs_counter():
    """torch.utils.flop_counter counts every mm/bmm the model really runs (naive attention: the full T×T
    scores), forward and then backward."""
    torch.manual_seed(0)
    cfg = from_name("tiny", 32)
    model = TransformerLM(cfg, attention="naive")
    tokens = torch.randint(0, cfg.vocab_size, (2, 32))
    with FlopCounterMode(display=False) as forward:
        loss = model(tokens, tokens)
    with FlopCounterMode(display=False) as backward:
        loss.backward()
    assert forward.get_total_flops() == step_flops(cfg, 2, 32, "forward") == 99_745_792
    assert forward.get_total_flops() + backward.get_total_flops() == step_flops(cfg, 2, 32, "train")


def test_causal_attention_counts_half_the_square():
    # B·H = 2, N = 128, d = 64: QKᵀ and P·V are 2·N²·d FLOPs each per head, 4·2·128²·64 = 8388608 in all.
    assert attention_flops(2, 128, 64, causal=False) == 8_388_608
    assert attention_flops(2, 128, 64, causal=True) == 4_194_304
    # The model's count keeps the full square under its causal mask: doubling T adds 4·B·L·d·(2T)² − 4·B·L·d·T²
    # of attention on top of twice the per-token matmuls.
    cfg = from_name("tiny", 64)
    weights = PRESET_FORWARD["tiny"][0]
    assert step_flops(cfg, 1, 64, "forward") - 2 * step_flops(cfg, 1, 32, "forward") == pytest.approx(
        4 * 2 * 64 * (64**2 - 2 * 32**2))
    assert step_flops(cfg, 1, 64, "forward") == 2 * 64 * weights + 4 * 2 * 64**2 * 64


# Device names as torch.cuda.get_device_name() prints them, and the dense datasheet peaks in TFLOP/s:
# (bf16, fp16, tf32, fp32). Dense tensor-core rates are half the sparse figures the datasheets print.
DATASHEET = {
    "NVIDIA H100 80GB HBM3": ("H100 SXM", 989.4, 989.4, 494.7, 66.9),  # 1979* / 1979* / 989* / 67
    "NVIDIA H100 PCIe": ("H100 PCIe", 756.0, 756.0, 378.0, 51.2),  # 1513* / 1513* / 756* / 51
    "NVIDIA H200": ("H200", 989.4, 989.4, 494.7, 66.9),  # 1979* / 1979* / 989* / 67
    "NVIDIA A100-SXM4-80GB": ("A100", 312.0, 312.0, 156.0, 19.5),  # 624* / 624* / 312* / 19.5
    "NVIDIA A100 80GB PCIe": ("A100", 312.0, 312.0, 156.0, 19.5),
    "NVIDIA L4": ("L4", 121.0, 121.0, 60.0, 30.3),  # 242* / 242* / 120* / 30.3
    "NVIDIA B200": ("B200", 2250.0, 2250.0, 1100.0, 80.0),  # 4.5P* / 4.5P* / 2.2P* / 80
    "NVIDIA L40S": ("L40S", 362.05, 362.05, 183.0, 91.6),
}


@pytest.mark.parametrize("device", list(DATASHEET))
def test_gpu_peak_table(device):
    name, bf16, fp16, tf32, fp32 = DATASHEET[device]
    peak = gpu_peak(device)
    assert (peak.name, peak.bf16_tflops, peak.fp16_tflops, peak.tf32_tflops, peak.fp32_tflops) == (
        name, bf16, fp16, tf32, fp32)


def test_unknown_devices_have_no_peak():
    assert gpu_peak("cpu") is None and gpu_peak(None) is None and gpu_peak("NVIDIA GeForce GTX 1080") is None
    assert mfu_pct(100.0, "cpu", True) is None


def test_mfu_against_the_peaks():
    assert mfu_pct(494.7, "NVIDIA H100 80GB HBM3", mixed_precision=True) == pytest.approx(50.0)
    assert mfu_pct(6.69, "NVIDIA H100 80GB HBM3", mixed_precision=False) == pytest.approx(10.0)
    assert mfu_pct(75.6, "NVIDIA H100 PCIe", mixed_precision=True) == pytest.approx(10.0)
