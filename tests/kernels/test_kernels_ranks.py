"""Several reports of one distributed job: per-rank and merged figures, communication overlap, stragglers, the
timeline's process per rank; on a real 2-rank gloo DDP recording and end to end under torchrun."""

from __future__ import annotations

import gzip
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from profiler_kit.cli import main
from profiler_kit.kernels.idle import covered_ns
from profiler_kit.kernels.ranks import rank_of, rank_traces, split_processes, summarize_ranks

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernels"
# Listed out of order on purpose: ranks come from the names.
RANKS = [FIXTURES / "cpu_ddp2_gloo.rank1.json.gz", FIXTURES / "cpu_ddp2_gloo.rank0.json.gz"]
REPO = Path(__file__).resolve().parents[2]


def run(*args: object):
    return CliRunner().invoke(main, [*map(str, args)])


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


def test_two_gloo_ranks_per_rank_and_merged():
    result = run("kernels", "summarize", *RANKS, "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema_version"] == 1
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    for rank in doc["ranks"]:
        assert rank["time_basis"] == "cpu_ops"
        assert list(rank["phases"]) == ["fwd", "bwd", "opt"]
        assert rank["categories"]["communication"] > 0
        assert rank["communication"]["bwd"]["comm_ns"] > 0
    merged = doc["merged"]
    for category, total in merged["categories"].items():
        assert total == sum(r["categories"][category] for r in doc["ranks"])
    for phase, stats in doc["stragglers"].items():
        walls = [r["phase_wall_ns"][phase] for r in doc["ranks"]]
        assert stats["slowest_rank"] == int(np.argmax(walls))
        assert stats["spread_pct"] == pytest.approx((max(walls) - min(walls)) * 100 / np.mean(walls))
    for column in ("comm_ns", "overlapped_ns", "exposed_ns"):
        assert merged["communication"]["bwd"][column] == sum(r["communication"]["bwd"][column] for r in doc["ranks"])
    # Collective calls per phase: the c10d operators that start inside the phase's ranges, counted by a loop.
    for path, rank in zip(sorted(RANKS), doc["ranks"], strict=True):
        events = _events(path)
        for phase in ("fwd", "bwd", "opt"):
            spans = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"] == phase]
            calls = [e for e in events if e["cat"] == "cpu_op" and e["name"].startswith("c10d::")
                     and any(a <= e["ts"] <= b for a, b in spans)]
            assert rank["collective_calls"][phase] == len(calls)
        assert rank["collective_calls"]["bwd"] > 0


def _events(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as fh:
        return [e for e in json.load(fh)["traceEvents"] if e.get("ph") == "X"]


def test_gloo_overlap_against_a_plain_loop():
    """Rank 0's collectives (gloo's spans, the c10d calls that queue them) that start inside `bwd`, against the
    outermost operators of its other threads."""
    ranked = summarize_ranks(rank_traces([RANKS[1]]))
    events = _events(RANKS[1])
    to_ns = lambda us: int(round(us * 1000))  # noqa: E731
    bwd = [(to_ns(e["ts"]), to_ns(e["ts"]) + to_ns(e["dur"])) for e in events if e["name"] == "bwd"]
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
        covered = set()
        for tid, a, b in outer:
            if tid != c["tid"] and b > start and a < end:
                covered.add((max(a, start), min(b, end)))
        points = sorted(covered)
        total, cur_a, cur_b = 0, None, None
        for a, b in points:
            if cur_b is None or a > cur_b:
                total += (cur_b - cur_a) if cur_b is not None else 0
                cur_a, cur_b = a, b
            else:
                cur_b = max(cur_b, b)
        overlapped += total + ((cur_b - cur_a) if cur_b is not None else 0)
    got = ranked.communication[0].set_index("phase").loc["bwd"]
    assert got["comm_ns"] == sum(to_ns(c["dur"]) for c in comm) > 0
    assert got["overlapped_ns"] == pytest.approx(overlapped, abs=len(comm) * 2)
    assert got["exposed_ns"] == pytest.approx(sum(to_ns(c["dur"]) for c in comm) - overlapped, abs=len(comm) * 2)


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
        assert list(rank["phases"]) == ["fwd", "bwd", "opt"] and rank["categories"]["communication"] > 0


def test_one_report_of_several_processes_is_split_per_process():
    """Two real exports in one trace, as nsys records a torchrun job: each process comes back whole."""
    from dataclasses import replace

    import pandas as pd

    from profiler_kit.kernels import load, summarize_trace

    a, b = load(FIXTURES / "h100_tiny_train_bf16.sqlite"), load(FIXTURES / "h100_tiny_train_fp32.sqlite")
    shift = int(a.kernels["process"].max()) + (1 << 24)
    moved = lambda frame: frame.assign(process=frame["process"] + shift)  # noqa: E731
    both = replace(a, kernels=pd.concat([a.kernels, moved(b.kernels)], ignore_index=True),
                   ranges=pd.concat([a.ranges, moved(b.ranges)], ignore_index=True))
    parts = split_processes(both)
    assert len(parts) == 2
    for part, original in zip(parts, (a, b), strict=True):
        ours, theirs = summarize_trace(part), summarize_trace(original)
        assert ours.category_ns() == theirs.category_ns() and ours.phase_ns() == theirs.phase_ns()
    ranked = summarize_ranks(list(enumerate(parts)))
    assert ranked.ranks == [0, 1] and ranked.summaries[1].total_ns == summarize_trace(b).total_ns
