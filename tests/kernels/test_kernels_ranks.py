"""Several reports of one distributed job: ranks from RANK, names or order; per-rank figures over the steady
steps, merged figures, communication overlap, stragglers, collective calls and arrivals, the one-off first
collective; on two synthetic GPU ranks whose every figure is computed here by hand, on a real 2-rank gloo DDP
recording, on the one-GPU NCCL recordings, and end to end under torchrun."""

from __future__ import annotations

import gzip
import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from profiler_kit.cli import main
from profiler_kit.errors import ProfilerKitError
from profiler_kit.kernels import load, summarize_trace
from profiler_kit.kernels.collectives import calls_per_phase, kind_of
from profiler_kit.kernels.idle import covered_ns
from profiler_kit.kernels.ranks import assign_ranks, rank_of, rank_traces, split_processes, summarize_ranks
from profiler_kit.kernels.trace import KernelTrace, kernel_frame, range_frame

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernels"
# Listed out of order on purpose: ranks come from the names.
RANKS = [FIXTURES / "cpu_ddp2_gloo.rank1.json.gz", FIXTURES / "cpu_ddp2_gloo.rank0.json.gz"]
DDP_NSYS = FIXTURES / "h100_ddp1_nsys.sqlite"
# nsys around `torchrun --nproc-per-node 2 tests/distributed/ddp_program.py --marks --capture --warmup 2 --steps
# 2` on two GPUs (the fixtures' README has the command).
TWO_GPUS_NSYS = FIXTURES / "gpu2_ddp_nccl.sqlite"
REPO = Path(__file__).resolve().parents[2]
MS, US = 1_000_000, 1_000
ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
BROADCAST = "ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def run(*args: object):
    return CliRunner().invoke(main, [*map(str, args)])


def gpu_rank(process: int, step_starts: list[int], walls: list[int], all_reduce: list[tuple[int, int]],
             broadcast: tuple[int, int]) -> KernelTrace:
    """One rank of a DDP job on a GPU, times in ms: steps `step` ⊃ `fwd` [s+0.1, s+2], `bwd` [s+2, s+6]; fwd
    launches a 1 ms matmul at s+0.5 (GPU s+0.6), bwd a 2 ms one at s+2.5 (GPU s+3, stream 1) and an all-reduce
    at s+2.6 (stream 2, GPU start and duration from `all_reduce`); before the steps, at 10, a broadcast (start,
    duration)."""
    names, starts, ends = [], [], []
    kernels = [("broadcast", BROADCAST, 10, broadcast[0], broadcast[1], 2)]
    for s, wall, (ar_start, ar_ms) in zip(step_starts, walls, all_reduce, strict=True):
        names += ["step", "fwd", "bwd"]
        starts += [s * MS, s * MS + 100 * US, (s + 2) * MS]
        ends += [(s + wall) * MS, (s + 2) * MS, (s + 6) * MS]
        kernels += [("fwd", "ampere_sgemm_128x64_nn", s + 0.5, s + 0.6, 1, 1),
                    ("bwd", "ampere_sgemm_128x64_nt", s + 2.5, s + 3, 2, 1),
                    ("bwd", ALL_REDUCE, s + 2.6, ar_start, ar_ms, 2)]
    frame = kernel_frame([k[1] for k in kernels], [round(k[4] * MS) for k in kernels],
                         [round(k[2] * MS) for k in kernels], [process] * len(kernels),
                         start_ns=[round(k[3] * MS) for k in kernels], stream=[k[5] for k in kernels])
    ranges = range_frame(names, starts, ends, [process] * len(names), [1] * len(names))
    return KernelTrace("synthetic", Path(f"rank-of-process-{process}"), frame, ranges, clock="host h")


# Rank 0 spends step 0 warming up (30 ms against 10), rank 1 steps 0 and 1 (30 and 16 ms): steps 2 and 3 are the
# job's steady steps. Rank 1 enters the all-reduce of steps 1-3 later (2, 6, 6 ms), and the broadcast before
# the steps 49 ms later: rank 0's broadcast lasts 50 ms, waiting for it.
RANK0 = dict(step_starts=[100, 130, 140, 150], walls=[30, 10, 10, 10],
             all_reduce=[(104, 1), (134, 3), (144, 7), (154, 7)], broadcast=(20, 50))
RANK1 = dict(step_starts=[100, 130, 146, 156], walls=[30, 16, 10, 10],
             all_reduce=[(104, 1), (136, 1), (150, 1), (160, 1)], broadcast=(69, 1))


def synthetic_job() -> list[tuple[int, KernelTrace]]:
    """The two ranks as one nsys report of two processes would give them: process 200 had RANK 1 and process
    300 RANK 0, against their id order."""
    a, b = gpu_rank(200, **RANK1), gpu_rank(300, **RANK0)
    both = replace(a, kernels=pd.concat([a.kernels, b.kernels], ignore_index=True),
                   ranges=pd.concat([a.ranges, b.ranges], ignore_index=True), process_ranks={200: 1, 300: 0},
                   path=Path("job.sqlite"))
    return assign_ranks([(Path("job.sqlite"), both)])


def test_steady_figures_of_two_synthetic_ranks_by_hand():
    ranked = summarize_ranks(synthetic_job())
    assert ranked.ranks == [0, 1]
    assert ranked.steady_steps == [2, 3] and ranked.warmup_steps == [0, 1]
    table = ranked.rank_table().set_index("rank")
    # Steps 2 and 3: fwd 1 ms + bwd 2 ms of matmul per step, and the all-reduces (rank 0's wait 6 ms in each).
    assert table["steps"].tolist() == [2, 2]
    assert table["wall_ms"].tolist() == [20.0, 20.0]
    assert table["total_ms"].tolist() == [2 + 4 + 14.0, 2 + 4 + 2.0]
    assert table["comm_ms"].tolist() == [14.0, 2.0]
    # Rank 0's all-reduce [s+4, s+11] is covered by the bwd matmul [s+3, s+5] for 1 ms, and in step 2 by step 3's
    # fwd matmul [150.6, 151.6] for 0.4 ms; rank 1's [s+4, s+5] is covered whole.
    assert table["exposed_comm_ms"].tolist() == [11.6, 0.0]
    assert table["fwd_wall_ms"].tolist() == [3.8, 3.8] and table["bwd_wall_ms"].tolist() == [8.0, 8.0]
    assert table["collective_calls"].tolist() == [2, 2]  # the NCCL kernels of bwd, one per step
    # Rank 1 entered both steady all-reduces last; rank 0 waited 6 ms in each.
    assert table["times_last"].tolist() == [0, 2] and table["waited_ms"].tolist() == [12.0, 0.0]
    comm = ranked.merged_communication().set_index("phase")
    assert comm.loc["bwd", "comm_ns"] == 16 * MS and comm.loc["bwd", "exposed_ns"] == 11.6 * MS
    assert comm.loc["bwd", "overlap_pct"] == pytest.approx(4.4 * 100 / 16)
    assert ranked.merged_categories()["matmul"] == 2 * 6 * MS
    stragglers = ranked.stragglers().set_index("phase")
    assert stragglers.loc["bwd", "spread_pct"] == 0.0
    arrivals = ranked.arrival_table()
    assert arrivals.to_dict("list") == {
        "step": [0, 1, 2, 3], "state": ["warm-up", "warm-up", "steady", "steady"], "collectives": [1, 1, 1, 1],
        "last_rank": [0, 1, 1, 1], "times_last": [1, 1, 1, 1], "wait_ms": [0.0, 2.0, 6.0, 6.0],
        "max_wait_ms": [0.0, 2.0, 6.0, 6.0]}
    # The broadcast before the steps: 50 ms on rank 0 against the steady all-reduces' median (7, 7, 1, 1 → 4 ms).
    assert ranked.one_off == {
        "kind": "broadcast", "rank": 0, "duration_ns": 50 * MS, "median_ns": 4.0 * MS, "median_of": "steady",
        "late_rank": 1, "late_by_ns": 49 * MS, "late_rank_duration_ns": 1 * MS, "step": None,
        "in_warmup_step": False, "in_tables": False}
    note = next(n for n in ranked.notes if "first collective" in n)
    assert note.startswith("rank 0's first collective (broadcast, outside the steps) took 50.0 ms")
    assert "rank 1, which entered it 49.0 ms later" in note and "outside the steady tables" in note
    doc = ranked.to_json()
    assert doc["steady_steps"] == [2, 3] and doc["clocks_comparable"] is True
    assert doc["merged"]["phases"] == {"fwd": 4 * MS, "bwd": (8 + 16) * MS}
    assert [r["steady"]["total_ns"] for r in doc["ranks"]] == [20 * MS, 8 * MS]
    # Each rank's own summary still covers its whole recording.
    assert doc["ranks"][0]["total_ns"] == (50 + 4 * 3 + 1 + 3 + 7 + 7) * MS


def test_ranks_on_different_clocks_are_compared_by_their_collectives_durations():
    """Each rank leaves a collective when the last one's data is in: the rank whose own all-reduce took least
    (rank 1: 1 ms against 7) entered last, and the other waited the difference, as on one clock."""
    (r0, t0), (r1, t1) = synthetic_job()
    ranked = summarize_ranks([(r0, t0), (r1, replace(t1, clock="host other"))])
    assert not ranked.arrivals.comparable
    table = ranked.rank_table().set_index("rank")
    assert table["times_last"].tolist() == [0, 2] and table["waited_ms"].tolist() == [12.0, 0.0]
    assert any("recorded on 2 clocks" in n and "durations" in n for n in ranked.notes)
    # The one-off is named from the durations too: rank 1's own broadcast was the short one.
    assert ranked.one_off["late_rank"] == 1 and ranked.one_off["late_by_ns"] is None
    doc = ranked.to_json()
    assert doc["clocks_comparable"] is False
    assert [(a["step"], a["last_rank"], a["wait_ms"]) for a in doc["arrivals"]] == [
        (0, 0, 0.0), (1, 1, 2.0), (2, 1, 6.0), (3, 1, 6.0)]


def test_a_rank_that_waited_inside_nccls_call_on_the_host_entered_when_its_call_did():
    """NCCL connects the ranks at their first collective on the host, before the kernel: both ranks' broadcast
    kernels run at the same GPU time, but rank 0's launch sits in a 9.9 ms `ncclBroadcast` range (it waited for
    rank 1 there) and rank 1's in a 0.15 ms one. Rank 0's broadcast took 10.9 ms, rank 1 entered 9.75 ms later."""
    steady = dict(step_starts=[100, 110, 120, 130], walls=[10] * 4,
                  all_reduce=[(104, 1), (114, 1), (124, 1), (134, 1)], broadcast=(69, 1))
    ranked = []
    for rank, (start, end) in enumerate([(0.2, 10.1), (9.9, 10.05)]):
        trace = gpu_rank(100 + rank, **steady)
        nccl = range_frame(["ncclBroadcast"], [round(start * MS)], [round(end * MS)], [100 + rank], [1])
        ranked.append((rank, replace(trace, ranges=pd.concat([trace.ranges, nccl], ignore_index=True))))
    first = summarize_ranks(ranked).one_off
    assert (first["rank"], first["late_rank"], first["kind"]) == (0, 1, "broadcast")
    assert first["duration_ns"] == round(10.9 * MS) and first["late_by_ns"] == round(9.75 * MS)
    # Without NCCL's ranges the kernels alone say nothing happened.
    assert summarize_ranks([(r, gpu_rank(100 + r, **steady)) for r in (0, 1)]).one_off is None


def test_a_job_without_steps_is_covered_whole():
    ranked = summarize_ranks([(r, replace(t, ranges=t.ranges[t.ranges["name"] != "step"]))
                              for r, t in synthetic_job()])
    assert ranked.steady_steps is None
    table = ranked.rank_table()
    # The broadcast, four fwd (1 ms) and bwd (2 ms) matmuls and the all-reduces.
    assert table["total_ms"].tolist() == [50 + 4 + 8 + 18.0, 1 + 4 + 8 + 4.0]
    assert table["steps"].tolist() == [0, 0] and table["wall_ms"].isna().all()
    # Against the other collectives' median (1, 1, 1, 1, 1, 3, 7, 7 ms → 1 ms), inside the tables.
    assert ranked.one_off["median_ns"] == 1.0 * MS and ranked.one_off["in_tables"]
    assert any("no repeating step range on rank 0, 1" in n for n in ranked.notes)
    assert any("which the tables include" in n for n in ranked.notes)


def test_ranks_come_from_rank_then_names_then_order():
    trace = load(RANKS[0])
    pid = int(trace.cpu_ops["process"].iloc[0])
    # RANK recorded beats the name; a report that says nothing is numbered by its place, with a note.
    ranked = assign_ranks([(Path("x.rank1.json.gz"), replace(trace, process_ranks={pid: 5})),
                           (Path("y.rank0.json.gz"), load(RANKS[1])),
                           (Path("z.json.gz"), load(RANKS[1]))])
    assert [rank for rank, _ in ranked] == [0, 1, 5]
    assert [t.path.name for _, t in ranked] == ["cpu_ddp2_gloo.rank0.json.gz"] * 2 + ["cpu_ddp2_gloo.rank1.json.gz"]
    assert any("rank 1 is z.json.gz by its place among the reports" in n for n in ranked[1][1].notes)
    with pytest.raises(ProfilerKitError, match="x.rank1.json.gz and y.json.gz are both rank 1"):
        assign_ranks([(Path("x.rank1.json.gz"), trace), (Path("y.json.gz"), replace(trace, process_ranks={pid: 1}))])


def test_covered_by_a_union_of_intervals():
    starts, ends = np.array([5, 0, 20]), np.array([15, 10, 30])
    got = covered_ns(starts, ends, np.array([0, 12, 15, 31, 25]), np.array([30, 22, 20, 40, 26]))
    assert got.tolist() == [25, 5, 0, 0, 1]
    assert covered_ns(np.array([], dtype=int), np.array([], dtype=int), np.array([0]), np.array([9])).tolist() == [0]
    rng = np.random.default_rng(0)
    s = rng.integers(0, 200, 40)
    e = s + rng.integers(0, 30, 40)
    qs = rng.integers(0, 200, 25)
    qe = qs + rng.integers(0, 50, 25)
    grid = np.zeros(300, dtype=bool)
    for a, b in zip(s, e, strict=True):
        grid[a:b] = True
    assert covered_ns(s, e, qs, qe).tolist() == [int(grid[a:b].sum()) for a, b in zip(qs, qe, strict=True)]


def test_rank_from_the_file_name():
    assert rank_of(Path("out.rank3.json.gz"), 0) == 3
    assert rank_of(Path("other.json.gz"), 2) == 2


def test_collective_kinds_from_kernel_and_span_names():
    assert [kind_of(n) for n in (ALL_REDUCE, "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm *)",
                                 "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "gloo:all_gather",
                                 "ncclDevKernel_SendRecv", "gloo:broadcast")] == [
        "allreduce", "allreduce", "reducescatter", "allgather", "sendrecv", "broadcast"]


def _events(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as fh:
        return [e for e in json.load(fh)["traceEvents"] if e.get("ph") == "X"]


def _inside(event: dict, spans: list[tuple[float, float]]) -> bool:
    return any(a <= event["ts"] <= b for a, b in spans)


def test_two_gloo_ranks_over_their_steady_step():
    result = run("kernels", "summarize", *RANKS, "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema_version"] == 1
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    # Two recorded steps: the first took over 1.5× the second on some rank.
    assert doc["steady_steps"] == [1] and doc["warmup_steps"] == [0]
    merged = doc["merged"]
    for category, total in merged["categories"].items():
        assert total == sum(r["steady"]["categories"][category] for r in doc["ranks"])
    for phase, stats in doc["stragglers"].items():
        walls = [r["phase_wall_ns"][phase] for r in doc["ranks"]]
        assert stats["slowest_rank"] == int(np.argmax(walls))
        assert stats["spread_pct"] == pytest.approx((max(walls) - min(walls)) * 100 / np.mean(walls))
    for column in ("comm_ns", "overlapped_ns", "exposed_ns"):
        assert merged["communication"]["bwd"][column] == sum(r["communication"]["bwd"][column] for r in doc["ranks"])
    # Against a loop over the trace: the second `step` of each rank, its phases' wall time and c10d calls.
    for path, rank in zip(sorted(RANKS), doc["ranks"], strict=True):
        events = _events(path)
        step = sorted((e for e in events if e["name"] == "step"), key=lambda e: e["ts"])[1]
        steady = [(step["ts"], step["ts"] + step["dur"])]
        assert rank["steady"]["wall_ns"] == round(step["dur"] * US)
        for phase in ("fwd", "bwd", "opt"):
            ranges = [e for e in events if e["name"] == phase and _inside(e, steady)]
            assert rank["phase_wall_ns"][phase] == sum(round(e["dur"] * US) for e in ranges)
            spans = [(e["ts"], e["ts"] + e["dur"]) for e in ranges]
            calls = [e for e in events if e["cat"] == "cpu_op" and e["name"].startswith("c10d::")
                     and _inside(e, spans)]
            assert rank["collective_calls"][phase] == len(calls)
        assert rank["collective_calls"]["bwd"] == 1
        # The whole recording is still there: its first step's broadcasts and all-reduce.
        assert rank["categories"]["communication"] > rank["steady"]["categories"]["communication"] > 0
    # One host: the ranks' collectives compare in time.
    assert doc["clocks_comparable"] is True
    assert [a["step"] for a in doc["arrivals"]] == [0, 1]


def test_gloo_overlap_against_a_plain_loop():
    """Rank 0's collectives (gloo's spans, the c10d calls that queue them) that start inside the steady `bwd`,
    against the outermost operators of its other threads."""
    ranked = summarize_ranks(rank_traces([RANKS[1]]))
    events = _events(RANKS[1])
    to_ns = lambda us: int(round(us * 1000))  # noqa: E731
    step = sorted((e for e in events if e["name"] == "step"), key=lambda e: e["ts"])[1]
    bwd = [(to_ns(e["ts"]), to_ns(e["ts"]) + to_ns(e["dur"])) for e in events
           if e["name"] == "bwd" and step["ts"] <= e["ts"] <= step["ts"] + step["dur"]]
    comm = [e for e in events if e["name"].startswith(("gloo:", "c10d::"))
            and any(a <= to_ns(e["ts"]) <= b for a, b in bwd)]
    assert {c["name"] for c in comm} == {"gloo:all_reduce", "c10d::allreduce_"}
    ops = sorted((e for e in events if e["cat"] == "cpu_op"), key=lambda e: (e["tid"], e["ts"], -e["dur"]))
    outer, reach = [], {}
    for e in ops:
        start, end = to_ns(e["ts"]), to_ns(e["ts"]) + to_ns(e["dur"])
        if start >= reach.get(e["tid"], -1) and end > start:
            outer.append((e["tid"], start, end))
            reach[e["tid"]] = end
    overlapped = 0
    for c in comm:
        start, end = to_ns(c["ts"]), to_ns(c["ts"]) + to_ns(c["dur"])
        grid = sorted((max(a, start), min(b, end)) for tid, a, b in outer if tid != c["tid"] and b > start and a < end)
        reach_end = start
        for a, b in grid:
            overlapped += max(b - max(a, reach_end), 0)
            reach_end = max(reach_end, b)
    got = ranked.members[0].communication.set_index("phase").loc["bwd"]
    assert got["comm_ns"] == sum(to_ns(c["dur"]) for c in comm) > 0
    assert got["overlapped_ns"] == pytest.approx(overlapped, abs=len(comm) * 2)
    assert got["exposed_ns"] == pytest.approx(sum(to_ns(c["dur"]) for c in comm) - overlapped, abs=len(comm) * 2)


def test_torch_traces_say_their_host_and_time_base():
    trace = load(RANKS[0])
    assert trace.clock == "host vm" and trace.clock_offset_ns == 1790857026000000000


def test_without_torchs_host_name_the_recorders_host_puts_the_ranks_on_one_clock(tmp_path):
    """torch.profiler writes `host_name` only in some releases (2.11 on the GPU machine does not); the recorder's
    metadata names the host too, and the ranks of one host compare in time; with neither, they do not."""
    def rewritten(recorder_host: str | None) -> list[Path]:
        paths = []
        for path in RANKS:
            with gzip.open(path, "rt") as fh:
                doc = json.load(fh)
            del doc["host_name"]
            if recorder_host is not None:
                doc["profiler_kit"] = {**doc.get("profiler_kit", {}), "host": recorder_host}
            paths.append(tmp_path / f"{recorder_host}.{path.name}")
            with gzip.open(paths[-1], "wt") as fh:
                json.dump(doc, fh)
        return paths

    named = summarize_ranks(rank_traces(rewritten("node7")))
    assert named.arrivals.comparable and len(named.arrivals.table) > 0
    assert (named.arrivals.table["last_rank"] >= 0).all()
    unnamed = summarize_ranks(rank_traces(rewritten(None)))
    assert not unnamed.arrivals.comparable and any("recorded on 2 clocks" in n for n in unnamed.notes)


def test_nccl_ranges_count_collective_calls_under_nsys():
    """The one-GPU DDP export launches no NCCL kernel; NCCL's own `ncclAllReduce` ranges (on another thread) are
    its calls: those that start inside each phase's ranges, by SQL."""
    import sqlite3

    con = sqlite3.connect(DDP_NSYS)
    query = ("SELECT count(*) FROM NVTX_EVENTS AS c JOIN StringIds AS cs ON cs.id = c.textId, NVTX_EVENTS AS p "
             "JOIN StringIds AS ps ON ps.id = p.textId WHERE cs.value = 'ncclAllReduce' AND ps.value = ? "
             "AND c.start BETWEEN p.start AND p.end")
    expected = {phase: con.execute(query, (phase,)).fetchone()[0] for phase in ("fwd", "bwd", "opt")}
    con.close()
    assert expected["bwd"] == 4
    ranked = summarize_ranks(rank_traces([DDP_NSYS]))
    assert ranked.steady_steps == [0, 1]
    assert ranked.members[0].collective_calls == expected
    # One rank: nobody to enter a collective before or after it.
    assert "times_last" not in ranked.rank_table().columns and ranked.to_json()["arrivals"] == []


def test_timeline_has_one_process_per_rank(tmp_path):
    out = tmp_path / "ranks.json"
    assert run("kernels", "timeline", *RANKS, "-o", out).exit_code == 0
    names = sorted(e["args"]["name"] for e in json.loads(out.read_text())["traceEvents"]
                   if e["name"] == "process_name")
    assert names == ["rank 0", "rank 1"]


def test_torchrun_two_ranks_under_the_torch_backend(tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.is_file():
        torchrun = shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("no torchrun")
    out = tmp_path / "ddp"
    result = run("nsys", "--backend", "torch", "-o", out, "--format", "json", "--", torchrun, "--nproc-per-node",
                 "2", REPO / "examples" / "train_ddp.py", "--width", "32", "--depth", "2", "--vocab", "64",
                 "--batch", "2", "--seq", "16", "--warmup", "1", "--steps", "2")
    assert result.exit_code == 0, result.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ddp.rank0.json.gz", "ddp.rank1.json.gz"]
    doc = json.loads(result.stdout)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    for rank in doc["ranks"]:
        assert list(rank["phase_wall_ns"]) == ["fwd", "bwd", "opt"] and rank["categories"]["communication"] > 0


def test_one_report_of_several_processes_is_split_per_process():
    """Two real exports in one trace, as nsys records a torchrun job: each process comes back whole."""
    a, b = load(FIXTURES / "h100_tiny_train_bf16.sqlite"), load(FIXTURES / "h100_tiny_train_fp32.sqlite")
    shift = int(a.kernels["process"].max()) + (1 << 24)
    moved = lambda frame: frame.assign(process=frame["process"] + shift)  # noqa: E731
    both = replace(a, kernels=pd.concat([a.kernels, moved(b.kernels)], ignore_index=True),
                   ranges=pd.concat([a.ranges, moved(b.ranges)], ignore_index=True))
    parts = split_processes(both)
    assert [proc for proc, _ in parts] == sorted({int(a.kernels["process"].iloc[0]),
                                                  int(b.kernels["process"].iloc[0]) + shift})
    for (_, part), original in zip(parts, (a, b), strict=True):
        ours, theirs = summarize_trace(part), summarize_trace(original)
        assert ours.category_ns() == theirs.category_ns() and ours.phase_ns() == theirs.phase_ns()
    ranked = assign_ranks([(Path("both.sqlite"), both)])
    assert [rank for rank, _ in ranked] == [0, 1]
    assert any("by its place among the reports and processes" in n for n in ranked[1][1].notes)
    assert summarize_ranks(ranked).members[1].rows.total_ns == summarize_trace(b).total_ns


@pytest.mark.skipif(not TWO_GPUS_NSYS.is_file(), reason="no 2-GPU NCCL recording among the fixtures")
def test_a_two_gpu_nccl_recording():
    """Each rank is its process, with the RANK it had; its kernel time, its NCCL kernels' time and NCCL's calls
    in each phase (the program's push/pop phase ranges, not the recorder's start/end marks of the same names) are
    what SQL finds for that process; the program's steps 2 and 3 keep their numbers; the
    collectives are matched across the ranks on the report's one clock."""
    import sqlite3

    con = sqlite3.connect(TWO_GPUS_NSYS)
    per_process = dict(con.execute("SELECT globalPid, sum(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL "
                                   "GROUP BY globalPid"))
    nccl = dict(con.execute("SELECT k.globalPid, sum(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL AS k JOIN "
                            "StringIds AS s ON s.id = k.demangledName WHERE s.value LIKE 'nccl%' GROUP BY 1"))
    calls = con.execute(
        "SELECT c.globalTid & ~0xFFFFFF, ps.value, count(*) FROM NVTX_EVENTS AS c JOIN StringIds AS cs "
        "ON cs.id = c.textId, NVTX_EVENTS AS p JOIN StringIds AS ps ON ps.id = p.textId WHERE cs.value IN "
        "('ncclAllReduce', 'ncclAllGather', 'ncclReduceScatter', 'ncclBroadcast') AND ps.value IN ('forward', "
        "'backward', 'optimizer') AND p.eventType = 59 AND c.start BETWEEN p.start AND p.end AND "
        "c.globalTid & ~0xFFFFFF = p.globalTid & ~0xFFFFFF GROUP BY 1, 2").fetchall()
    con.close()
    ranked_traces = rank_traces([TWO_GPUS_NSYS])
    assert [rank for rank, _ in ranked_traces] == [0, 1]
    assert all(trace.process_ranks for _, trace in ranked_traces)
    ranked = summarize_ranks(ranked_traces)
    for (_, trace), member in zip(ranked_traces, ranked.members, strict=True):
        summary = summarize_trace(trace)
        assert member.rows.total_ns == summary.total_ns == per_process[member.process] > 0
        whole = member.rows.figures(None)
        assert whole.totals["categories"]["communication"] == summary.category_ns()["communication"] == nccl[
            member.process] > 0
        counted = calls_per_phase(trace, summary.attributed, summary.labelled)
        assert {phase: n for phase, n in counted.items() if n} == {
            phase: n for process, phase, n in calls if process == member.process} == {
            phase: n for phase, n in whole.collective_calls.items() if n}
        assert summary.steps["step"].tolist() == [2, 3] == member.rows.step_numbers[:-1].tolist()
    # The steady steps are the whole capture: the per-rank table counts the same calls, and the phases the
    # program marked lie inside the recorder's step marks although these are a lane apart.
    table = ranked.rank_table()
    assert table["collective_calls"].tolist() == [
        sum(n for process, _, n in calls if process == m.process) for m in ranked.members]
    assert (table[[f"{p}_wall_ms" for p in ("forward", "backward", "optimizer")]] > 0).all().all()
    assert ranked.arrivals.comparable and len(ranked.arrivals.table)
