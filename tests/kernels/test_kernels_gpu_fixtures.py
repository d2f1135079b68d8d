"""Summaries of the example programs recorded on an H100 (tests/fixtures/kernels/README.md says how): the
example's own phases against a direct query of its export, per-block backward ranges, and NCCL kernels as
communication. Each test runs once its recording is among the fixtures."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from profiler_kit.kernels import summarize
from profiler_kit.kernels.ranks import rank_traces, summarize_ranks

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernels"
EXAMPLE = FIXTURES / "h100_example_mlp.sqlite"
DDP_TORCH = FIXTURES / "h100_ddp1_torch.rank0.json.gz"


def needs(path: Path):
    return pytest.mark.skipif(not path.is_file(), reason=f"{path.name} is not among the fixtures")


# Kernels whose launching call started inside a range of the phase, in the same process, on any thread.
PHASE_TOTALS = """
WITH r AS (SELECT n.start, n.end, coalesce(n.text, s.value) AS name, n.globalTid >> 24 AS pid
           FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId
           WHERE n.eventType = (SELECT id FROM ENUM_NSYS_EVENT_TYPE WHERE name = 'NvtxPushPopRange')),
     l AS (SELECT correlationId AS corr, start AS t, globalTid >> 24 AS pid FROM CUPTI_ACTIVITY_KIND_RUNTIME),
     k AS (SELECT correlationId AS corr, globalPid >> 24 AS pid, end - start AS d FROM CUPTI_ACTIVITY_KIND_KERNEL)
SELECT r.name, SUM(k.d) FROM k JOIN l ON l.corr = k.corr AND l.pid = k.pid
JOIN r ON r.pid = l.pid AND l.t BETWEEN r.start AND r.end WHERE r.name = ? GROUP BY r.name
"""


@needs(EXAMPLE)
def test_example_phases_match_a_direct_query():
    summary = summarize(EXAMPLE)
    assert summary.phase_names == ["fwd", "bwd", "opt"]
    con = sqlite3.connect(EXAMPLE)
    for phase, totals in summary.phase_ns().items():
        ((_, expected),) = con.execute(PHASE_TOTALS, (phase,)).fetchall()
        assert totals["total_ns"] == expected


@needs(EXAMPLE)
def test_example_blocks_have_backward_kernels():
    summary = summarize(EXAMPLE, phases=["blocks.0.forward", "blocks.0.backward", "blocks.3.backward"])
    phases = summary.phase_ns()
    assert all(phases[p]["total_ns"] > 0 and phases[p]["categories"]["matmul"] > 0 for p in phases)
    assert summary.idle is not None and set(summary.idle["verdict"]) <= {"launch-bound", "gpu-bound"}


@needs(DDP_TORCH)
def test_one_gpu_rank_reports_its_communication():
    ranked = summarize_ranks(rank_traces([DDP_TORCH]))
    assert ranked.ranks == [0] and ranked.members[0].rows.phase_names == ["fwd", "bwd", "opt"]
    doc = ranked.to_json()
    # One rank: DDP's all-reduce launches no NCCL kernel, so no phase has communication time, while the
    # collective calls are still counted.
    assert all(phase["comm_ns"] == 0 for phase in doc["merged"]["communication"].values())
    assert doc["ranks"][0]["collective_calls"]["bwd"] > 0
