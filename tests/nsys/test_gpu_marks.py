"""On a GPU, under a recent nsys (`$PK_TEST_NSYS`, or the one profiler-kit finds): the recorder's automatic marks of
an unannotated program (examples/train_plain.py) give the same phases and steps under nsys, torch.profiler and
the memory history, and nsys's per-phase kernel totals equal a direct SQL query over the marks; a program's
`record_function` ranges reach nsys; and under torchrun on 2 GPUs every rank is recorded into one report, told
apart by its RANK, from its first CUDA call to exit, or over the window it marks."""

from __future__ import annotations

import json
import re
import sqlite3
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from profiler_kit.cli import main
from profiler_kit.kernels import load
from profiler_kit.memory import load_snapshot

REPO = Path(__file__).resolve().parents[2]
PLAIN = [str(REPO / "examples" / "train_plain.py"), "--width", "256", "--depth", "2", "--heads", "4", "--vocab",
         "1024", "--batch", "4", "--seq", "128", "--steps", "4"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
PHASES = ["forward", "backward", "optimizer_step"]
# Kernel time per automatic mark and process: kernels whose launching runtime call started inside a start/end
# range of the profiler_kit NVTX domain, on any thread of the same process.
MARKS_SQL = """
WITH d AS (SELECT domainId AS id, globalTid >> 24 AS pid FROM NVTX_EVENTS
           WHERE eventType = (SELECT id FROM ENUM_NSYS_EVENT_TYPE WHERE name = 'NvtxDomainCreate')
             AND text = 'profiler_kit'),
     r AS (SELECT n.start, n.end, coalesce(n.text, s.value) AS name, n.globalTid >> 24 AS pid
           FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId
           JOIN d ON d.id = n.domainId AND d.pid = n.globalTid >> 24
           WHERE n.eventType = (SELECT id FROM ENUM_NSYS_EVENT_TYPE WHERE name = 'NvtxStartEndRange')),
     l AS (SELECT correlationId AS corr, start AS t, globalTid >> 24 AS pid FROM CUPTI_ACTIVITY_KIND_RUNTIME),
     k AS (SELECT correlationId AS corr, globalPid >> 24 AS pid, end - start AS d FROM CUPTI_ACTIVITY_KIND_KERNEL)
SELECT r.pid, r.name, SUM(k.d) FROM k JOIN l ON l.corr = k.corr AND l.pid = k.pid
JOIN r ON r.pid = l.pid AND l.t BETWEEN r.start AND r.end GROUP BY r.pid, r.name
"""
pytestmark = [pytest.mark.gpu, pytest.mark.gpu_slow]


def record(tmp_path: Path, name: str, *args: str) -> tuple[object, dict | None]:
    """`profiler-kit ARGS` writing `tmp_path/name.*`: the CLI result, and its JSON summary for one process."""
    out = tmp_path / name
    result = CliRunner().invoke(main, [*args[:args.index("--")], "-o", str(out), "--format", "json",
                                       *args[args.index("--"):]])
    assert result.exit_code == 0, result.output
    return result, None if "torch.distributed.run" in args else json.loads(result.stdout)


def marks_sql(sqlite: Path) -> dict[tuple[int, str], int]:
    with sqlite3.connect(sqlite) as db:
        return {(pid, name): total for pid, name, total in db.execute(MARKS_SQL)}


def test_an_unannotated_program_has_the_same_phases_and_steps_under_every_recorder(tmp_path, gpu_nsys):
    _, nsys_doc = record(tmp_path, "nsys", "nsys", "--nsys", str(gpu_nsys.path), "--", sys.executable, *PLAIN)
    _, torch_doc = record(tmp_path, "torch", "nsys", "--backend", "torch", "--", sys.executable, *PLAIN)
    for doc in (nsys_doc, torch_doc):
        assert doc["phase_rule"] == "auto" and list(doc["phases"]) == PHASES and len(doc["steps"]) == 4
    by_sql = marks_sql(tmp_path / "nsys.sqlite")
    for phase in PHASES:
        (sql,) = [total for (_, name), total in by_sql.items() if name == phase]
        assert nsys_doc["phases"][phase]["total_ns"] == pytest.approx(sql, rel=0.01)
        assert torch_doc["phases"][phase]["total_ns"] == pytest.approx(sql, rel=0.02)
    result = CliRunner().invoke(main, ["memory", "-o", str(tmp_path / "memory"), "--", sys.executable, *PLAIN])
    assert result.exit_code == 0, result.output
    rows = load_snapshot(tmp_path / "memory.pickle")["profiler_kit"]["phases"]
    auto = [(row["step"], row["phase"]) for row in rows if row["kind"] == "auto"]
    micro = ["forward", "backward"] * 2 + ["optimizer_step"]  # two micro-batches, then the optimizer step
    assert auto == [(step, phase) for step in range(4) for phase in micro]


def test_record_function_ranges_reach_nsys(tmp_path, gpu_nsys):
    _, nsys_doc = record(tmp_path, "nsys", "nsys", "--nsys", str(gpu_nsys.path), "--", sys.executable, *PLAIN,
                         "--record-function")
    _, torch_doc = record(tmp_path, "torch", "nsys", "--backend", "torch", "--", sys.executable, *PLAIN,
                          "--record-function")
    for doc in (nsys_doc, torch_doc):
        assert doc["phase_rule"] == "program" and list(doc["phases"]) == ["fwd", "bwd", "opt"]
    ranges = load(tmp_path / "nsys.sqlite").ranges
    assert (ranges.loc[ranges["kind"] == "program", "name"].value_counts()[["fwd", "bwd", "opt"]] == [8, 8, 4]).all()


two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")


@pytest.mark.multi_gpu
@two_gpus
def test_nsys_around_torchrun_without_a_window_records_every_rank(tmp_path, gpu_nsys):
    record(tmp_path, "ddp", "nsys", "--nsys", str(gpu_nsys.path), "--", *TORCHRUN, *PLAIN)
    trace = load(tmp_path / "ddp.sqlite")
    assert sorted(trace.process_ranks.values()) == [0, 1]
    by_sql = marks_sql(tmp_path / "ddp.sqlite")
    with sqlite3.connect(tmp_path / "ddp.sqlite") as db:
        per_process = dict(db.execute("SELECT globalPid >> 24, SUM(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL "
                                      "GROUP BY 1"))
    for process in trace.process_ranks:
        mine = trace.ranges[trace.ranges["process"] == process]
        steps = mine[(mine["kind"] == "auto") & (mine["name"] == "step")]
        assert steps["number"].tolist() == [0, 1, 2, 3]
        launched = trace.kernels[trace.kernels["process"] == process]
        assert int(launched["total_ns"].sum()) == per_process[process >> 24] > 0
        assert sum(total for (pid, _), total in by_sql.items() if pid == process >> 24) > 0


@pytest.mark.multi_gpu
@two_gpus
def test_nsys_around_torchrun_records_each_ranks_window(tmp_path, gpu_nsys):
    example = str(REPO / "examples" / "train_ddp.py")
    result, _ = record(tmp_path, "window", "nsys", "--nsys", str(gpu_nsys.path), "--", *TORCHRUN, example,
                       "--warmup", "2", "--steps", "3")
    assert "recorded the steps profiler_kit.capture marks, 3 steps" in result.stderr
    trace = load(tmp_path / "window.sqlite")
    assert sorted(trace.process_ranks.values()) == [0, 1]
    for process in trace.process_ranks:
        mine = trace.ranges[trace.ranges["process"] == process]
        steps = mine[(mine["kind"] == "auto") & (mine["name"] == "step")]
        assert steps["number"].tolist() == [2, 3, 4]  # the marked steps on every rank, the last one whole
        assert (mine["end_ns"] > mine["start_ns"]).all()


def test_profile_picks_nsys_on_a_gpu_and_memory_history_with_memory(tmp_path, gpu_nsys):
    """`profile` on a GPU machine with nsys: Nsight Systems, said in its first line, GPU kernels per phase and
    step; `profile --memory`: the CUDA memory history's report, as `memory --` gives it."""
    result, doc = record(tmp_path, "auto", "profile", "--nsys", str(gpu_nsys.path), "--", sys.executable, *PLAIN)
    assert result.stderr.splitlines()[0].startswith(f"recorder: Nsight Systems {gpu_nsys.version_str}")
    assert (tmp_path / "auto.nsys-rep").is_file() and (tmp_path / "auto.sqlite").is_file()
    assert doc["time_basis"] == "gpu_kernels" and list(doc["phases"]) == PHASES
    assert len(doc["steps"]) == 4
    _, report = record(tmp_path, "mem", "profile", "--memory", "--", sys.executable, *PLAIN)
    assert (tmp_path / "mem.pickle").is_file() and report["peak"]["allocated_bytes"] > 0
    # Labelled `step S, PHASE`, with ` #n` where a step runs a phase more than once (two micro-batches).
    assert {re.sub(r" #\d+$", "", p["name"].split(", ")[-1]) for p in report["phases"]} >= set(PHASES)
