"""The category rule table on real kernel names: those in our H100 recordings (nsys's demangling and
torch.profiler's), and names other tools print for kernels our recordings do not have (cuDNN attention,
FlashAttention, Ampere SGEMM, CUTLASS, NCCL, Inductor's Triton kernels, this project's Triton kernels)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from profiler_kit.kernels import CATEGORIES, categorize, category_of, load, summarize
from profiler_kit.kernels.categories import RULES

FIXTURES = Path(__file__).parents[1] / "fixtures" / "kernels"
EXAMPLE = Path(__file__).parents[2] / "profiles" / "examples" / "small_ctx128_train_bf16.sqlite"
RECORDINGS = [*sorted(FIXTURES.glob("h100_*.sqlite")), *sorted(FIXTURES.glob("h100_*.json.gz")), EXAMPLE]
# H100 recordings with fused attention kernels (`--attention sdpa`: cuDNN; `flash`: our Triton kernels).
FUSED_ATTENTION = sorted(FIXTURES.glob("h100_*_sdpa.sqlite")) + sorted(FIXTURES.glob("h100_*_flash.sqlite"))

NAMES = [
    # cuDNN SDPA on H100: matmul instructions in the name, attention by what it does.
    (
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1"
        "x1_kernel0_0",
        "attention",
    ),
    (
        "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x128_1x4x1_cga1x1x1",
        "attention",
    ),
    (
        "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 128, 4, false, false, cutlass::bfloat16_t>>",
        "attention",
    ),
    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80", "attention"),
    ("fmha_cutlassB_bf16_aligned_128x128_k128_sm80", "attention"),
    ("triton_tem_fused_flex_attention_0", "attention"),
    # This project's Triton FlashAttention-2 kernels.
    ("_flash_attn_fwd_kernel", "attention"),
    ("_flash_attn_bwd_dkdv_kernel", "attention"),
    ("_flash_attn_bwd_dq_kernel", "attention"),
    ("_flash_attn_bwd_preprocess_kernel", "attention"),
    ("nvjet_sm90_tst_144x64_64x8_1x2_h_bz_TNN", "matmul"),
    ("nvjet_tst_192x128_64x4_1x2_h_bz_coopA_NTT", "matmul"),
    ("ampere_sgemm_128x64_tn", "matmul"),
    (
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_seg"
        "ment_k_off_kernel",
        "matmul",
    ),
    (
        "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8>("
        "T1::Params)",
        "matmul",
    ),
    (
        "void cublasLt::splitKreduce_kernel<(int)32, (int)16, int, float, __nv_bfloat16, float, __n"
        "v_bfloat16, (bool)0>",
        "matmul",
    ),
    ("triton_tem_fused_mm_0", "matmul"),
    (
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)",
        "communication",
    ),
    ("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm *, unsigned long, ncclWork *)", "communication"),
    (
        "void at::native::vectorized_layer_norm_kernel<float, float>(int, T2, const T1 *, const T1 "
        "*, const T1 *)",
        "normalization",
    ),
    (
        "void <unnamed>::softmax_warp_forward<float, float, float, (int)7, (bool)0, (bool)0>(T2 *, "
        "const T1 *, int)",
        "softmax",
    ),
    ("triton_per_fused__softmax_0", "softmax"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "reduction"),
    ("triton_poi_fused_add_mul_silu_1", "elementwise"),
    (
        "void at::native::reduce_kernel<(int)512, (int)1, at::native::ReduceOp<float, at::native::M"
        "eanOps<float, "
        "float, float, float>, unsigned int, float, (int)4, (int)4>>(T3)",
        "reduction",
    ),
    (
        "void at::native::<unnamed>::multi_tensor_apply_kernel<at::native::<unnamed>::TensorListMet"
        "adata<(int)2>, "
        "at::native::<unnamed>::TernaryOpScalarFunctor<float, (int)2, (int)2, (int)0>, at::native::"
        "LerpFunctor<float>, "
        "float>(T1, T2, T3...)",
        "optimizer",
    ),
    ("_adamw_master_kernel", "optimizer"),
    (
        "void at::native::vectorized_elementwise_kernel<(int)8, at::native::bfloat16_copy_kernel_cuda("
        "at::TensorIteratorBase &)::[lambda(float) (instance 1)], std::array<char *, (unsigned long"
        ")2>>(int, T2, T3)",
        "copy",
    ),
    (
        "void at::native::<unnamed>::CatArrayBatchedCopy_vectorized<at::native::<unnamed>::OpaqueTy"
        "pe<(unsigned int)2>,"
        " unsigned int, (int)1, (int)128, (int)1, (int)16, (int)8>",
        "copy",
    ),
    (
        "void at::native::vectorized_elementwise_kernel<(int)4, at::native::FillFunctor<float>, std"
        "::array<char *, "
        "(unsigned long)1>>(int, T2, T3)",
        "elementwise",
    ),
    ("some_kernel_nobody_has_seen_yet", "other"),
]


@pytest.mark.parametrize("name, category", NAMES)
def test_real_names(name, category):
    assert category_of(name) == category


def test_rule_table_is_ordered_and_covers_the_categories():
    order = [category for category, _ in RULES]
    assert order.index("attention") < order.index("matmul")
    assert order.index("communication") < order.index("reduction")
    assert order.index("copy") < order.index("elementwise")
    assert set(order) | {"other"} == set(CATEGORIES)


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.name)
def test_every_kernel_of_our_recordings_is_named_by_a_rule(path):
    names = load(path).kernels["name"].astype(str).unique()
    assert len(names) > 0
    assert [n for n in names if category_of(n) == "other"] == []


def test_nsys_and_torch_demangling_land_in_the_same_categories():
    """The same H100 workload recorded by nsys and by torch.profiler: names are spelled differently
    (`<(int)4, ...>` vs `<4, ...>`), the kernels per category are the same."""
    counts = []
    for path in (FIXTURES / "h100_tiny_train_bf16.sqlite", FIXTURES / "h100_tiny_train_bf16_trace.json.gz"):
        kernels = load(path).kernels
        counts.append(
            kernels.assign(category=categorize(kernels["name"])).groupby("category", observed=True).size()
        )
    pd.testing.assert_series_equal(counts[0], counts[1])


def test_categorize_matches_category_of():
    names = pd.Series([name for name, _ in NAMES] * 2)
    assert list(categorize(names)) == [category_of(n) for n in names]


@pytest.mark.parametrize("path", FUSED_ATTENTION, ids=lambda p: p.name)
def test_fused_attention_kernels_are_attention(path):
    """Inside the `attention` ranges, the fused kernels (names with `wgmma` for cuDNN) count as attention."""
    inside = summarize(path, nvtx="attention")
    assert inside.category_ns()["attention"] > 0
