"""On two GPUs (NCCL): the tests' own DDP and FSDP2 programs under `profiler-kit nsys -- torchrun
--nproc-per-node 2` (marked, plain, with torch.cuda.nvtx phases) and `--backend torch`: every rank's kernel time
equals a direct query of its process's kernels, NCCL's collectives are counted in the phases, each process is
the rank it had, and a rank that starts late is named as a one-off outside the steady tables. The built-in
workload under `--parallel ddp|fsdp` gives rows per rank and the aggregate. With `--basetemp DIR` the recordings
stay under DIR for the record."""

from __future__ import annotations

import gzip
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from profiler_kit.kernels.ranks import rank_traces

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
DDP, FSDP2 = str(HERE / "ddp_program.py"), str(HERE / "fsdp2_program.py")
TWO_GPUS = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                              reason="needs 2 GPUs")
pytestmark = [pytest.mark.gpu, pytest.mark.gpu_slow, pytest.mark.multi_gpu, TWO_GPUS]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
PROGRAMS = {
    "ddp_marks": [DDP, "--marks", "--warmup", "0", "--steps", "8", "--width", "1024"],
    "ddp_plain": [DDP, "--warmup", "0", "--steps", "8", "--width", "1024"],
    "fsdp2_nvtx": [FSDP2, "--warmup", "0", "--steps", "8", "--width", "1024"],
}
LATE_S = 2.0
MS = 1_000_000


def record(out: Path, program: list[str], backend: str = "nsys") -> dict:
    """`profiler-kit nsys [--backend torch] -o OUT --format json -- torchrun --nproc-per-node 2 PROGRAM`; its
    JSON, also kept beside the recording with the run's stderr."""
    command = [sys.executable, "-m", "profiler_kit", "nsys", "--backend", backend, "-o", str(out), "--format",
               "json", "--", *TORCHRUN, *program]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=out.parent,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
                              str(REPO), os.environ.get("PYTHONPATH")]))})
    out.with_name(out.name + ".stderr.txt").write_text(done.stderr)
    assert done.returncode == 0, done.stderr[-4000:]
    out.with_name(out.name + ".summary.json").write_text(done.stdout)
    return json.loads(done.stdout)


def kernel_ns_per_process(export: Path) -> dict[int, int]:
    con = sqlite3.connect(export)
    try:
        return dict(con.execute("SELECT globalPid, sum(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL "
                                "GROUP BY globalPid").fetchall())
    finally:
        con.close()


@pytest.mark.parametrize("name", PROGRAMS)
def test_under_nsys_each_rank_is_its_process(tmp_path, name):
    doc = record(tmp_path / name, PROGRAMS[name])
    export = tmp_path / f"{name}.sqlite"
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    assert {r["process"]: r["total_ns"] for r in doc["ranks"]} == kernel_ns_per_process(export)
    # Each process is the RANK it had, as the recorder saw it (never the process order).
    assert all(trace.process_ranks for _, trace in rank_traces([export]))
    for rank in doc["ranks"]:
        assert rank["categories"]["communication"] > 0  # NCCL's kernels
        if rank["phase_wall_ns"]:  # a program with phases
            assert sum(rank["collective_calls"].values()) > 0
    if name != "ddp_plain":
        assert all(sum(r["collective_calls"].values()) > 0 for r in doc["ranks"])
        assert doc["steady_steps"] and doc["clocks_comparable"] and doc["arrivals"]


@pytest.mark.parametrize("name", ["ddp_marks", "fsdp2_nvtx"])
def test_torch_backend_each_rank_is_its_trace(tmp_path, name):
    doc = record(tmp_path / name, PROGRAMS[name], backend="torch")
    for rank in doc["ranks"]:
        with gzip.open(tmp_path / f"{name}.rank{rank['rank']}.json.gz", "rt") as fh:
            events = json.load(fh)["traceEvents"]
        kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
        assert rank["total_ns"] == sum(round(e["dur"] * 1000) for e in kernels)
        assert sum(rank["collective_calls"].values()) > 0 and rank["categories"]["communication"] > 0
    assert doc["clocks_comparable"] and doc["arrivals"]


def nccl_entries(export: Path, name: str) -> dict[int, int]:
    """Per process (globalPid), when its thread entered its first NCCL call `name` (its NVTX range's start)."""
    con = sqlite3.connect(export)
    try:
        rows = con.execute("SELECT n.globalTid, min(n.start) FROM NVTX_EVENTS AS n LEFT JOIN StringIds AS s ON "
                           "s.id = n.textId WHERE coalesce(n.text, s.value) = ? GROUP BY n.globalTid",
                           (name,)).fetchall()
    finally:
        con.close()
    entries: dict[int, int] = {}
    for tid, start in rows:
        process = tid >> 24 << 24  # a thread's globalTid carries its process's globalPid in the high bits
        entries[process] = min(start, entries.get(process, start))
    return entries


def test_a_rank_that_starts_late_is_a_one_off(tmp_path):
    """NCCL's communicator set up at init_process_group (`--bind-device`); rank 1 sleeps before the first
    collective. NCCL connects the ranks at that collective, on the host, so rank 0 waits in its call before the
    kernel: it is named as the one that waited, rank 1 as the late one, by as much later as its NCCL call began
    (that call's NVTX range, read with SQL), and at least as late as the ranks' own clocks say (each wrote when it
    started building DDP, whose constructor makes that call: a busy machine may delay the late one further)."""
    doc = record(tmp_path / "late", [DDP, "--marks", "--warmup", "0", "--steps", "8", "--width", "1024",
                                     "--bind-device",
                                     "--late-rank", "1", "--late-s", str(LATE_S), "--late-at", "collective"])
    stderr = (tmp_path / "late.stderr.txt").read_text().splitlines()
    entered = {e["rank"]: e["entered"] for e in map(json.loads, (line for line in stderr
                                                                if line.startswith('{"entered"')))}
    first = doc["one_off"]
    assert first["rank"] == 0 and first["late_rank"] == 1 and not first["in_tables"]
    calls = nccl_entries(tmp_path / "late.sqlite", "ncclAllGather")
    process = {rank["rank"]: rank["process"] >> 24 << 24 for rank in doc["ranks"]}
    assert first["late_by_ns"] == pytest.approx(calls[process[1]] - calls[process[0]], abs=10 * MS)
    assert first["late_by_ns"] > entered[1] - entered[0] - 0.05 * LATE_S * 1e3 * MS
    assert first["late_by_ns"] > 0.5 * LATE_S * 1e3 * MS
    for rank in doc["ranks"]:
        assert rank["steady"]["categories"]["communication"] < 0.1 * LATE_S * 1e3 * MS


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_builtin_workload_rows_per_rank(tmp_path, parallel):
    done = subprocess.run([*TORCHRUN, "-m", "profiler_kit", "benchmark", "--model", "small", "--ctx", "256",
                           "--mixed-precision", "--warmup", "3", "--steps", "5", "--parallel", parallel, "--format",
                           "json"], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-4000:]
    rows = json.loads(done.stdout)["results"]
    assert [r["rank"] for r in rows] == [0, 1, "all"] and all(r["status"] == "ok" for r in rows)
    assert rows[2]["tokens_per_s"] == pytest.approx(2 * rows[0]["batch_size"] * 256 / (
        max(r["total_ms"] for r in rows[:2]) / 1e3))
