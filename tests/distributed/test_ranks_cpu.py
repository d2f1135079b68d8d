"""Distributed jobs recorded for real on the CPU (gloo, torchrun, `profiler-kit nsys --backend torch`): a rank
that starts late leaves the steady per-rank tables alone and is named as a one-off; two torchrun "nodes" of two
ranks each, recorded with an `-o` each, summarize together as global ranks 0-3; an FSDP2 program whose phases
are `torch.cuda.nvtx` ranges gives every rank its phases, steps and collectives."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
PROFILE = [sys.executable, "-m", "profiler_kit", "nsys", "--backend", "torch"]
LATE_S = 2.0
# The example model at its smallest: a step of a few ms, so that a busy 2-core box stays far below LATE_S.
SMALL = ["--width", "32", "--depth", "2", "--vocab", "64", "--batch", "2", "--seq", "16"]
MS = 1_000_000


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def recorded(out: Path, torchrun: list[str], program: list[str], cwd: Path) -> subprocess.Popen:
    """`profiler-kit nsys --backend torch -o OUT --format json -- torchrun ... PROGRAM`, started in a process
    group of its own."""
    return subprocess.Popen([*PROFILE, "-o", str(out), "--format", "json", "--", *TORCHRUN, *torchrun, *program],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), cwd=cwd,
                            start_new_session=True)


def finished(proc: subprocess.Popen, timeout_s: float = 300) -> dict:
    """The JSON a recording printed; a run past `timeout_s` is killed with everything it started."""
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"no end after {timeout_s:g} s: {stderr[-3000:]}")
    assert proc.returncode == 0, stderr[-3000:]
    return json.loads(stdout)


@pytest.mark.parametrize("late_at", ["collective", "init"])
def test_a_rank_that_starts_late(tmp_path, late_at):
    """Rank 1 sleeps LATE_S before its first collective (the wait NCCL's lazy set-up puts in the first
    collective), or before init_process_group (gloo connects there, where no operator runs)."""
    program = [str(HERE / "ddp_program.py"), "--marks", "--warmup", "0", "--steps", "6", *SMALL,
               "--late-rank", "1", "--late-s", str(LATE_S), "--late-at", late_at]
    doc = finished(recorded(tmp_path / "late", ["--standalone", "--nproc-per-node", "2"], program, tmp_path))
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    assert doc["steady_steps"] and set(doc["steady_steps"]) <= set(range(6))
    for rank in doc["ranks"]:
        assert list(rank["phase_wall_ns"]) == ["forward", "backward", "optimizer"]
        # The steady steps hold milliseconds of gloo all-reduce per step, not the 2 s wait.
        assert rank["steady"]["categories"]["communication"] < 0.25 * LATE_S * 1e3 * MS
        assert rank["collective_calls"]["backward"] == len(doc["steady_steps"])
        assert rank["steady"]["steps"] == len(doc["steady_steps"])
    for stats in doc["stragglers"].values():
        assert stats["max_wall_ms"] < 0.25 * LATE_S * 1e3
    first = doc["one_off"]
    if late_at == "collective":
        # Rank 0 waited in DDP's first collective for rank 1: in its recording, set apart from the steady steps.
        assert doc["ranks"][0]["categories"]["communication"] > 0.9 * LATE_S * 1e3 * MS
        assert first["rank"] == 0 and first["late_rank"] == 1 and first["step"] is None
        assert 0.9 * LATE_S * 1e3 * MS < first["late_by_ns"] < 1.5 * LATE_S * 1e3 * MS
        assert first["duration_ns"] > 0.9 * LATE_S * 1e3 * MS and not first["in_tables"]
    else:
        # gloo connects the ranks in init_process_group, which runs no operator: the 2 s are spent there, and no
        # collective waits for them.
        assert first is None or first["duration_ns"] < 0.5 * LATE_S * 1e3 * MS
        assert all(r["categories"]["communication"] < 0.5 * LATE_S * 1e3 * MS for r in doc["ranks"])


def test_two_nodes_of_two_ranks_give_global_ranks(tmp_path):
    port = str(free_port())
    program = [str(HERE / "ddp_program.py"), "--marks", "--warmup", "0", "--steps", "4", *SMALL]
    nodes = [recorded(tmp_path / f"node{node}", ["--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "2",
                                                 "--master-addr", "127.0.0.1", "--master-port", port],
                      program, tmp_path) for node in (0, 1)]
    for node in nodes:
        finished(node)
    names = sorted(p.name for p in tmp_path.glob("node*.json.gz"))
    assert names == ["node0.rank0.json.gz", "node0.rank1.json.gz", "node1.rank2.json.gz", "node1.rank3.json.gz"]
    done = subprocess.run([sys.executable, "-m", "profiler_kit", "kernels", "summarize",
                           *map(str, sorted(tmp_path.glob("node*.json.gz"))), "--format", "json"],
                          capture_output=True, text=True, env=env(), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2, 3]
    # One host: one clock, so who entered each collective last is compared across all four.
    assert doc["clocks_comparable"] is True and doc["arrivals"]
    assert all(r["collective_calls"]["backward"] == len(doc["steady_steps"]) for r in doc["ranks"])


def test_fsdp2_program_with_nvtx_phases(tmp_path):
    program = [str(HERE / "fsdp2_program.py"), "--warmup", "0", "--steps", "4", *SMALL]
    doc = finished(recorded(tmp_path / "fsdp", ["--standalone", "--nproc-per-node", "2"], program, tmp_path))
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    for rank in doc["ranks"]:
        assert list(rank["phase_wall_ns"]) == ["forward", "backward", "optimizer"]
        # FSDP2 gathers each block's parameters in forward and backward and reduce-scatters its gradients.
        assert rank["collective_calls"]["forward"] > 0 and rank["collective_calls"]["backward"] > 0
        assert rank["steady"]["categories"]["communication"] > 0
    assert doc["arrivals"] and {a["step"] for a in doc["arrivals"]} == set(range(4))
