"""The rules of a distributed job's summary on small synthetic GPU ranks of one report (one clock), through
`summarize_ranks`: which rank a step waited for when ranks tie in collectives entered last, when the first
collective is a one-off (both of its thresholds), and a phase that opens at the very start of its step; and where
a report's ranks come from when a report of several processes says no RANK."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pandas as pd
import pytest

from profiler_kit.kernels.ranks import rank_traces, summarize_ranks
from profiler_kit.kernels.trace import KernelTrace, kernel_frame, range_frame

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernels"
MS = 1_000_000
ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
BROADCAST = "ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
MATMUL = "ampere_sgemm_128x64_nn"
STEP_MS = 20.0
STEP_STARTS = [100.0, 120.0, 140.0, 160.0]


def rank(process: int, all_reduces: list[list[tuple[float, float]]], fwd_from_ms: float = 1.0,
         broadcast: tuple[float, float] | None = None) -> KernelTrace:
    """One rank, times in ms: steps of STEP_MS at STEP_STARTS, each `step` ⊃ `fwd` [s + fwd_from_ms, s + 5] with a
    1 ms matmul and `bwd` [s + 5, s + 19] launching the step's all-reduces (GPU start after the step's start,
    duration) 0.1 ms apart from s + 5.5; before the steps, at 10 ms, the broadcast (GPU start, duration) if any."""
    kernels = [(BROADCAST, 10.0, *broadcast)] if broadcast else []
    names, starts, ends = [], [], []
    for s, reduces in zip(STEP_STARTS, all_reduces, strict=True):
        names += ["step", "fwd", "bwd"]
        starts += [s, s + fwd_from_ms, s + 5]
        ends += [s + STEP_MS, s + 5, s + 19]
        kernels.append((MATMUL, s + 2, s + 2.1, 1.0))
        kernels += [(ALL_REDUCE, s + 5.5 + 0.1 * i, s + start, ms) for i, (start, ms) in enumerate(reduces)]
    frame = kernel_frame([k[0] for k in kernels], [round(k[3] * MS) for k in kernels],
                         [round(k[1] * MS) for k in kernels], [process] * len(kernels),
                         start_ns=[round(k[2] * MS) for k in kernels], stream=[7] * len(kernels))
    ranges = range_frame(names, [round(t * MS) for t in starts], [round(t * MS) for t in ends],
                         [process] * len(names), [1] * len(names))
    return KernelTrace("synthetic", Path(f"rank{process}"), frame, ranges, clock="host h")


def test_a_tie_in_collectives_entered_last_goes_to_the_rank_that_held_the_others_longer():
    # Each step: rank 0 enters the first all-reduce 1 ms after rank 1, rank 1 the second 3 ms after rank 0.
    # Both ranks entered one collective last; rank 1 held rank 0 longer (3 ms against 1 ms).
    ranked = summarize_ranks([(0, rank(0, [[(7, 0.5), (10, 3.5)]] * 4)),
                              (1, rank(1, [[(6, 1.5), (13, 0.5)]] * 4))])
    arrivals = ranked.arrival_table()
    assert arrivals["collectives"].tolist() == [2] * 4
    assert arrivals["last_rank"].tolist() == [1] * 4 and arrivals["times_last"].tolist() == [1] * 4
    assert arrivals["wait_ms"].tolist() == pytest.approx([4.0] * 4)
    # Over the steady steps each rank entered 4 collectives last; rank 0 waited 3 ms in each step, rank 1 1 ms.
    table = ranked.rank_table().set_index("rank")
    assert table["times_last"].tolist() == [4, 4] and table["waited_ms"].tolist() == pytest.approx([12.0, 4.0])


STEADY = [[(8, 0.5)]] * 4


@pytest.mark.parametrize(("broadcast_ms", "steady_ms", "one_off"), [
    (2.0, 0.5, False),  # over 1 ms, under 10× the steady 0.5 ms
    (0.6, 0.05, False),  # over 10× the steady 0.05 ms, under 1 ms
    (8.0, 0.5, True),  # over both
])
def test_the_first_collective_is_a_one_off_only_over_both_thresholds(broadcast_ms, steady_ms, one_off):
    steady = [[(8, steady_ms)]] * 4
    # Rank 0 enters the broadcast at 20 ms and waits for rank 1, which enters as rank 0's ends.
    late = 20 + broadcast_ms - steady_ms
    ranked = summarize_ranks([(0, rank(0, steady, broadcast=(20, broadcast_ms))),
                              (1, rank(1, steady, broadcast=(late, steady_ms)))])
    if not one_off:
        assert ranked.one_off is None
        assert not any("first collective" in note for note in ranked.notes)
        return
    assert {k: ranked.one_off[k] for k in ("kind", "rank", "duration_ns", "median_ns", "late_rank", "step")} == {
        "kind": "broadcast", "rank": 0, "duration_ns": 8 * MS, "median_ns": 0.5 * MS, "late_rank": 1,
        "step": None}


def test_a_phase_that_opens_with_its_step_counts_in_the_steady_figures():
    ranked = summarize_ranks([(0, rank(0, STEADY, fwd_from_ms=0.0)), (1, rank(1, STEADY, fwd_from_ms=0.0))])
    assert ranked.steady_steps == [0, 1, 2, 3]
    table = ranked.rank_table().set_index("rank")
    assert table["fwd_wall_ms"].tolist() == [4 * 5.0] * 2 and table["bwd_wall_ms"].tolist() == [4 * 14.0] * 2
    for doc in ranked.to_json()["ranks"]:
        assert doc["steady"]["phase_ns"] == {"fwd": 4 * MS, "bwd": 4 * MS // 2}
        assert doc["phase_wall_ns"] == {"fwd": 20 * MS, "bwd": 56 * MS}


def _without_rank_marks(source: Path, target: Path) -> Path:
    """A copy of a real export whose processes no longer say their RANK (their NVTX marks dropped)."""
    shutil.copyfile(source, target)
    with sqlite3.connect(target) as con:
        assert con.execute("DELETE FROM NVTX_EVENTS WHERE eventType = 34").rowcount > 0
    return target


def test_a_report_of_several_processes_named_for_one_rank_numbers_them_by_place(tmp_path):
    """`.rank3.` in the name of a 2-process report is no process's rank: each gets its place, with a note."""
    path = _without_rank_marks(FIXTURES / "gpu2_ddp_nccl.sqlite", tmp_path / "job.rank3.sqlite")
    ranked = rank_traces([path])
    assert [r for r, _ in ranked] == [0, 1]
    for r, trace in ranked:
        assert any(f"rank {r} is {path} process" in note and "by its place" in note for note in trace.notes)
    processes = [int(pd.unique(trace.kernels["process"])[0]) for _, trace in ranked]
    assert processes == sorted(processes)


def test_a_report_of_one_process_takes_the_rank_its_name_gives(tmp_path):
    path = _without_rank_marks(FIXTURES / "gpu2_ddp_nccl.sqlite", tmp_path / "job.sqlite")
    one = tmp_path / "one.rank3.sqlite"
    shutil.copyfile(FIXTURES / "h100_tiny_train_bf16.sqlite", one)
    assert [r for r, _ in rank_traces([one])] == [3]
    assert [r for r, _ in rank_traces([path, one])] == [0, 1, 3]
