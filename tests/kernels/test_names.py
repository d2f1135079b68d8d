"""Kernel names folded for matching across reports, on the names real tools wrote."""

from __future__ import annotations

from pathlib import Path

import pytest

from profiler_kit.kernels import load, summarize_trace
from profiler_kit.kernels.names import GEMM, match, normalize, top_movers

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernels"


def per_name(name: str):
    return summarize_trace(load(FIXTURES / name)).kernels


@pytest.mark.parametrize(("a", "b"), [
    # The same bf16 H100 run, read from an nsys 2025 export, nsys 2022.4 stats and nsys 2025 stats.
    ("h100_tiny_train_bf16.sqlite", "nsys2022_tiny_train_bf16_gpukernsum.csv"),
    ("nsys2022_tiny_train_bf16_gpukernsum.csv", "nsys2025_h100_tiny_train_bf16_cuda_gpu_kern_sum.csv"),
])
def test_one_run_read_by_two_nsys_versions_matches_name_for_name(a, b):
    matched = match(per_name(a), per_name(b))
    assert set(matched["status"]) == {"both"}
    assert (matched["b_ns"] - matched["a_ns"]).abs().max() < 1_000  # stats tables round to the µs at most
    assert (matched["a_names"] == matched["b_names"]).all()


def test_fp32_and_bf16_runs_match_by_operation():
    a, b = per_name("h100_tiny_train_fp32.sqlite"), per_name("h100_tiny_train_bf16.sqlite")
    matched = match(a, b).set_index("kernel")
    # Every cuBLAS kernel is one GEMM operation: sm80_xmma_* and cutlass sgemm in fp32, nvjet_sm90_* in bf16.
    gemm = matched.loc[GEMM]
    assert gemm["status"] == "both"
    assert any(n.startswith("sm80_xmma_gemm") for n in gemm["a_names"])
    assert all(n.startswith("nvjet_sm90") for n in gemm["b_names"])
    library = gemm["a_ns"] + matched.loc[f"{GEMM} split-K reduction", "a_ns"]
    assert library == a.loc[a["category"] == "matmul", "total_ns"].sum()
    # The same functor through another launcher and dtype is the same operation.
    add = matched.loc["at::native::elementwise_kernel<at::native::CUDAFunctor_add<T>>"]
    assert add["status"] == "both"
    assert {n.split("<")[0] for n in add["b_names"]} == {"void at::native::vectorized_elementwise_kernel",
                                                         "void at::native::unrolled_elementwise_kernel"}
    # The bf16 run's casts are new; AdamW's multi-tensor kernels are in both.
    assert matched.loc["at::native::elementwise_kernel<at::native::bfloat16_copy_kernel_cuda>", "status"] == "new"
    adam = matched[matched.index.str.contains("multi_tensor_apply_kernel")]
    assert len(adam) >= 5 and set(adam["status"]) == {"both"}
    # Nothing is lost: the matched totals are each side's totals.
    assert matched["a_ns"].sum() == a["total_ns"].sum() and matched["b_ns"].sum() == b["total_ns"].sum()


def test_top_movers_explain_nine_tenths_of_the_delta():
    matched = match(per_name("h100_tiny_train_fp32.sqlite"), per_name("h100_tiny_train_bf16.sqlite"))
    movers = top_movers(matched)
    delta = matched["b_ns"] - matched["a_ns"]
    total = delta.sum()
    assert abs(total - delta[: len(movers)].sum()) <= 0.1 * abs(total)
    assert len(movers) < len(matched)
    assert abs(total - delta[: len(movers) - 1].sum()) > 0.1 * abs(total)


@pytest.mark.parametrize(("name", "folded"), [
    ("triton_poi_fused_add_mul_12", "triton_poi_fused_add_mul_N"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
     "ncclDevKernel_AllReduce_Sum_T_RING_LL"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
     "ncclDevKernel_AllReduce_Sum_T_RING_LL"),
    ("void cublasLt::splitKreduce_kernel<(int)32, (int)16, int, float>(cublasLt::cublasSplitKParams<T6>)",
     f"{GEMM} split-K reduction"),
    ("nvjet_sm90_tst_64x8_64x16_1x4_h_bz_NNT", GEMM),
    ("void at::native::reduce_kernel<(int)512, (int)1, at::native::ReduceOp<c10::BFloat16, at::native::MeanOps<"
     "float, float, float, float>, unsigned int, float, (int)4, (int)4>>(T3)",
     "at::native::reduce_kernel<N, N, at::native::ReduceOp<T, at::native::MeanOps<T, T, T, T>, T, T, N, N>>"),
])
def test_normalize_folds_dtypes_sizes_and_suffixes(name, folded):
    assert normalize(name) == folded
