"""Kernels to NVTX ranges: containment on any thread of the process, nesting, and the phases of real H100
recordings, where the autograd thread launches the backward kernels. nsys's own per-thread attribution
(`nvtx_kern_sum`) is the reference where it is right (forward) and the counter-example where it is not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from profiler_kit.errors import ProfilerKitError
from profiler_kit.kernels import summarize
from profiler_kit.kernels.attribution import RangeIndex
from profiler_kit.kernels.nsys_stats import read_stats_table, to_ns
from profiler_kit.kernels.trace import NO_LAUNCH, match_launches, range_frame

FIXTURES = Path(__file__).parents[1] / "fixtures" / "kernels"
EXAMPLE = Path(__file__).parents[2] / "profiles" / "examples" / "small_ctx128_train_bf16.sqlite"
BF16 = FIXTURES / "h100_tiny_train_bf16.sqlite"
TRACE = FIXTURES / "h100_tiny_train_bf16_trace.json.gz"
PHASES = ["forward", "backward", "optimizer_step"]

#        name        start end  process thread
RANGES = [
    ("step", 0, 100, 1, 10),
    ("forward", 0, 40, 1, 10),
    ("layer", 5, 20, 1, 10),
    ("layer", 20, 35, 1, 10),  # touches its sibling at t=20
    ("backward", 40, 90, 1, 10),
    ("worker", 50, 60, 1, 11),  # another thread of the same process
    ("other_process", 0, 100, 2, 20),
]


def index() -> RangeIndex:
    names, starts, ends, procs, threads = zip(*RANGES, strict=True)
    return RangeIndex(range_frame(names, starts, ends, procs, threads))


def containing(idx: RangeIndex, t: int, process: int = 1) -> set[str]:
    points, ids = idx.containing(np.array([t]), np.array([process]), np.arange(len(idx.ranges)))
    return set(idx.names().to_numpy()[ids])


def test_depth_and_parent_follow_push_pop_nesting():
    idx = index()
    names = list(idx.names())
    assert list(idx.depth) == [0, 1, 2, 2, 1, 0, 0]
    parents = {names[i]: (names[p] if p >= 0 else None) for i, p in enumerate(idx.parent)}
    assert parents == {
        "step": None,
        "forward": "step",
        "layer": "forward",
        "backward": "step",
        "worker": None,
        "other_process": None,
    }
    assert not idx.overlapping


@pytest.mark.parametrize(
    "t, expected",
    [
        (10, {"step", "forward", "layer"}),
        (20, {"step", "forward", "layer"}),  # the boundary of two siblings: one of them, once
        (38, {"step", "forward"}),
        (55, {"step", "backward", "worker"}),  # ranges of every thread of the process
        (95, {"step"}),
        (150, set()),
    ],
)
def test_a_launch_is_in_every_range_containing_it(t, expected):
    assert containing(index(), t) == expected


def test_ranges_of_other_processes_do_not_count():
    assert containing(index(), 10, process=2) == {"other_process"}
    assert containing(index(), 10, process=3) == set()


def test_children_are_the_direct_sub_ranges():
    idx = index()
    forward = np.flatnonzero(idx.names().to_numpy() == "forward")
    assert list(idx.names().to_numpy()[idx.children_of(forward)]) == ["layer", "layer"]


@pytest.mark.parametrize("path", [BF16, TRACE, EXAMPLE], ids=lambda p: p.name)
def test_phases_cover_every_kernel_of_a_train_step(path):
    summary = summarize(path)
    phases = summary.phase_ns()
    assert list(phases) == PHASES
    assert sum(p["total_ns"] for p in phases.values()) == summary.total_ns
    assert phases["optimizer_step"]["categories"]["optimizer"] == phases["optimizer_step"]["total_ns"]


def test_backward_gets_the_autograd_threads_kernels_that_nvtx_kern_sum_misses():
    """nsys matches kernels to ranges of the launching thread only: its `backward` holds one kernel. Its
    `forward` (all launched by the main thread) must equal ours kernel by kernel."""
    nsys = read_stats_table((FIXTURES / "nsys2025_h100_tiny_train_bf16_nvtx_kern_sum.csv").read_text()).frame
    # nsys 2025 names ranges `domain:name`, with an empty domain for the default one.
    nsys = nsys.assign(
        ns=to_ns(nsys["Total Time (ns)"], "ns"),
        n=nsys["Kern Inst"].astype(int),
        range=nsys["NVTX Range"].str.replace(r"^:", "", regex=True),
    )
    summary = summarize(BF16, phases=PHASES)
    ours = summary.phases.groupby("phase")["instances"].sum()
    assert 0 < nsys.loc[nsys["range"] == "backward", "n"].sum() < ours["backward"] / 10
    assert ours["backward"] > ours["forward"]
    forward_ns = nsys.loc[nsys["range"] == "forward", "ns"].sum()
    assert forward_ns == summary.phase_ns()["forward"]["total_ns"]


def test_nested_range_kernels_match_nvtx_kern_sum():
    """Ranges inside forward are all on the main thread: nsys's per-range totals are ours."""
    nsys = read_stats_table((FIXTURES / "nsys2022_tiny_train_bf16_nvtxkernsum.csv").read_text()).frame
    nsys = nsys.assign(ns=to_ns(nsys["Total Time (ns)"], "ns"))
    for name in ("attention", "attn_scores", "softmax", "attn_value", "ffn", "layer_0"):
        assert summarize(BF16, nvtx=name).total_ns == nsys.loc[nsys["NVTX Range"] == name, "ns"].sum(), name


@pytest.mark.parametrize("path", [BF16, TRACE], ids=lambda p: p.name)
def test_attention_split_by_its_sub_ranges(path):
    summary = summarize(path, nvtx="attention")
    split = summary.to_json()["nvtx"]["sub_ranges"]
    assert list(split) == ["attn_scores", "softmax", "attn_value", "(rest of attention)"]
    assert sum(s["total_ns"] for s in split.values()) == summary.total_ns
    assert split["softmax"]["categories"]["softmax"] > 0
    assert split["softmax"]["categories"]["matmul"] == 0
    assert split["attn_scores"]["categories"]["matmul"] > 0
    assert split["attn_value"]["categories"]["matmul"] > 0
    # Attention ranges exist in the forward pass only.
    phases = summary.phase_ns()
    assert phases["forward"]["total_ns"] == summary.total_ns and phases["backward"]["total_ns"] == 0


def test_an_unknown_range_lists_the_known_ones():
    with pytest.raises(ProfilerKitError, match=r"no NVTX range of that name; the report has: .*attn_scores"):
        summarize(BF16, nvtx="atention")


def test_nvtx_needs_a_source_with_ranges():
    with pytest.raises(ProfilerKitError, match="cannot hold NVTX ranges"):
        summarize(FIXTURES / "nsys2025_h100_tiny_train_bf16_cuda_gpu_kern_sum.csv", nvtx="attention")


def test_explicit_phases_that_are_missing_are_zero_with_a_note():
    summary = summarize(BF16, phases=["forward", "warmup"])
    assert summary.phase_ns()["warmup"]["total_ns"] == 0
    assert any("warmup" in note for note in summary.notes)
    outside = summary.phases.loc[summary.phases["phase"] == "(outside phases)", "total_ns"].sum()
    assert outside == summary.total_ns - summary.phase_ns()["forward"]["total_ns"]


def test_launches_match_by_correlation_id_within_a_process():
    #                       kernel 0  1  2   3   4 (no id)
    kernel_corr = np.array([7, 8, 7, 99, -1])
    kernel_proc = np.array([1, 1, 2, 1, 1])
    launch_corr = np.array([8, 7, 7, -1])
    launch_ns = np.array([800, 700, 7000, 5])
    launch_proc = np.array([1, 1, 2, 1])
    launch, process = match_launches(kernel_corr, launch_corr, launch_ns, launch_proc, kernel_proc)
    assert list(launch) == [700, 800, 7000, NO_LAUNCH, NO_LAUNCH]
    assert list(process) == [1, 1, 2, 0, 0]
    # Without kernel processes (torch.profiler: a kernel's pid is its device), ids alone decide.
    launch, _ = match_launches(np.array([8, 5]), launch_corr[:2], launch_ns[:2], launch_proc[:2])
    assert list(launch) == [800, NO_LAUNCH]


def test_nvtx_split_of_a_train_step_says_why_backward_is_empty():
    summary = summarize(BF16, nvtx="attention")
    assert summary.phase_ns()["forward"]["total_ns"] > 0
    assert any("backward, optimizer_step" in note and "autograd" in note for note in summary.notes)
