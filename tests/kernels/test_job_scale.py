"""A job of many ranks: a planted slow rank is the slowest in every phase and first among those who made the job
wait, one late only at start-up is told apart, the per-rank and per-node tables show the slowest, the fastest and
the outliers, and the JSON holds each rank's figures, not its kernels."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from profiler_kit.kernels.rank_rows import RowOptions
from profiler_kit.kernels.ranks import summarize_ranks
from profiler_kit.kernels.trace import KernelTrace, kernel_frame, range_frame
from profiler_kit.kernels.waits import ONCE, REPEATED, START_UP
from profiler_kit.outliers import EACH_END, SHOW_ALL, Z_LIMIT, pick, robust_z

MS = 1_000_000
RANKS, PER_NODE, STEPS = 24, 8, 4
SLOW, SLOW_MS = 13, 3.0  # its forward and backward take this much longer in every step
LATE_START, LATE_START_MS = 6, 5.0  # it enters the broadcast before the steps this much later, only there
ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
BROADCAST = "ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def extra_ms() -> np.ndarray:
    """(ranks, steps): how much longer each rank's compute took in each step than the fastest could: up to 0.2 ms
    of jitter, the slow rank SLOW_MS more."""
    extra = np.random.default_rng(7).uniform(0, 0.2, size=(RANKS, STEPS))
    extra[SLOW] += SLOW_MS
    return extra


def job_rank(rank: int, extra: np.ndarray) -> KernelTrace:
    """One rank on the job's one clock, times in ms: a broadcast at 20 (LATE_START enters it LATE_START_MS late,
    the others wait), then steps of 30 ms from 100, each `step` ⊃ `fwd` [s+0.1, s+2+e/2] with a matmul and `bwd`
    [s+2+e/2, s+6+e] with a matmul and an all-reduce launched at its end. Every rank leaves the all-reduce when
    the last one's data is in: it starts when the rank enters and lasts until 1 ms after the last entry."""
    process = 1000 + rank
    late = LATE_START_MS if rank == LATE_START else 0.0
    kernels = [(BROADCAST, 19, 20 + late, 1 + LATE_START_MS - late, 2)]
    names, starts, ends = [], [], []
    for step in range(STEPS):
        s, e, last = 100 + 30 * step, extra[rank, step], extra[:, step].max()
        names += ["step", "fwd", "bwd"]
        starts += [s, s + 0.1, s + 2 + e / 2]
        ends += [s + 30, s + 2 + e / 2, s + 6 + e]
        kernels += [("ampere_sgemm_128x64_nn", s + 0.5, s + 0.6, 1 + e / 2, 1),
                    ("ampere_sgemm_128x64_nt", s + 2.5 + e / 2, s + 3 + e / 2, 2 + e / 2, 1),
                    (ALL_REDUCE, s + 5.9 + e, s + 6 + e, last - e + 1, 2)]
    ns = [[round(k[i] * MS) for k in kernels] for i in (1, 2, 3)]
    frame = kernel_frame([k[0] for k in kernels], ns[2], ns[0], [process] * len(kernels), start_ns=ns[1],
                         stream=[k[4] for k in kernels])
    ranges = range_frame(names, [round(t * MS) for t in starts], [round(t * MS) for t in ends],
                         [process] * len(names), [1] * len(names))
    return KernelTrace("synthetic", Path(f"job.rank{rank}.sqlite"), frame, ranges, clock="host h",
                       process_ranks={process: rank}, process_nodes={process: rank // PER_NODE})


@pytest.fixture(scope="module")
def job():
    extra = extra_ms()
    return summarize_ranks([(rank, job_rank(rank, extra)) for rank in range(RANKS)])


def test_the_planted_slow_rank_is_the_slowest_in_every_phase_and_made_the_job_wait(job):
    assert job.steady_steps == list(range(STEPS))
    assert set(job.stragglers()["slowest_rank"]) == {SLOW}
    first, *rest = job.made_wait().to_dict("records")
    assert first["rank"] == SLOW and first["node"] == SLOW // PER_NODE and first["lateness"] == REPEATED
    assert first["times_last"] == first["steps_last"] == STEPS
    # The others waited for it in every step: its extra time less theirs, summed over the other ranks.
    extra = extra_ms()
    waited = sum((extra[SLOW, s] - np.delete(extra[:, s], SLOW)).sum() for s in range(STEPS))
    assert first["caused_wait_ms"] == pytest.approx(waited, abs=1e-3)
    # Its lead over the next latest rank, per step.
    lead = sum(extra[SLOW, s] - np.sort(extra[:, s])[-2] for s in range(STEPS))
    assert first["delay_ms"] == pytest.approx(lead, abs=1e-3)
    # The rank late at start-up only: apart, with the others' wait for it at the broadcast.
    late = [row for row in rest if row["rank"] == LATE_START]
    assert late and late[0]["lateness"] == START_UP and late[0]["times_last"] == 0
    assert late[0]["startup_caused_wait_ms"] == pytest.approx((RANKS - 1) * LATE_START_MS, abs=1e-3)
    assert all(row["lateness"] != ONCE for row in rest)


def test_many_ranks_show_the_slowest_the_fastest_and_the_outliers(job):
    table = job.rank_table()
    # Every step took as long on every rank; the slow rank is the one that waited least.
    assert table["step_ms"].nunique() == 1 and table["busy_step_ms"].idxmax() == SLOW
    assert len(table) == RANKS and table["z_score"].iloc[SLOW] > Z_LIMIT
    (title, shown), = [(t, f) for t, f in job.tables(display=True) if t.name == "ranks"]
    assert len(shown) == 2 * EACH_END < RANKS and shown["rank"].iloc[0] == SLOW
    assert f"{RANKS - 2 * EACH_END:,} other ranks not shown" in title
    job.every_rank = True
    try:
        (_, every), = [(t, f) for t, f in job.tables(display=True) if t.name == "ranks"]
    finally:
        job.every_rank = False
    assert every["rank"].tolist() == list(range(RANKS))
    nodes = job.node_table()
    assert nodes["node"].tolist() == [0, 1, 2] and nodes["ranks"].tolist() == [PER_NODE] * 3
    slow_node = nodes.set_index("node").loc[SLOW // PER_NODE]
    assert slow_node["slowest_rank"] == SLOW and slow_node["busy_step_ms"] == nodes["busy_step_ms"].max()


def test_the_json_holds_each_ranks_figures_not_its_kernels(job):
    doc = json.loads(json.dumps(job.to_json()))
    assert len(doc["ranks"]) == RANKS and len(json.dumps(doc)) <= 4096 * RANKS
    assert all("top_kernels" not in rank for rank in doc["ranks"])
    assert doc["made_wait"][0]["rank"] == SLOW
    detailed = summarize_ranks([(0, job_rank(0, extra_ms())), (1, job_rank(1, extra_ms()))],
                               RowOptions(detail=True)).to_json()
    assert all(rank["top_kernels"] for rank in detailed["ranks"])


def test_robust_z_and_the_rows_picked():
    values = np.linspace(9.0, 11.0, 60)
    z = robust_z(values)
    assert np.abs(z).max() < Z_LIMIT
    # A table of SHOW_ALL rows is shown whole; a longer one, its ends and the outliers between them.
    assert pick(values[:SHOW_ALL]).left_out == 0
    planted = np.r_[values, np.full(EACH_END, 50.0), 30.0]
    picked = pick(planted)
    assert set(picked.rows[:EACH_END].tolist()) == set(range(60, 60 + EACH_END))
    assert picked.rows[EACH_END] == 60 + EACH_END  # the outlier between the ends
    assert picked.further == 1 and picked.left_out == len(planted) - 2 * EACH_END - 1
    # More than half the rows the same: the mean absolute deviation stands in.
    flat = np.r_[np.full(40, 10.0), 10.5, 20.0]
    assert robust_z(flat)[-1] > Z_LIMIT and robust_z(flat)[0] == 0
    assert (robust_z(np.full(5, 3.0)) == 0).all()
