"""Every kernel's labels, set once (`kernels.labels`), against what SQL finds in the real exports: the step and the
phase each kernel was launched in, its rank and node, its stream, the path of the ranges open at its launch and
the empty module slot; the same labels whatever the block size; CPU operators labelled like kernels; and the
summary's per-step and per-phase totals are sums over the labels."""

from __future__ import annotations

import bisect
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from profiler_kit.kernels import load, summarize_trace, trace
from profiler_kit.kernels.labels import LABELS, NO_STEP, OUTSIDE_PHASES, label

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernels"
MLP = FIXTURES / "h100_example_mlp.sqlite"  # `step` ⊃ fwd/bwd/opt ⊃ the modules' ranges, one process
TWO_GPUS = FIXTURES / "gpu2_ddp_nccl.sqlite"  # two ranks, the recorder's step marks of steps 2 and 3
CPU_MLP = FIXTURES / "cpu_example_mlp_torch.json.gz"


def _sql_launches(path: Path) -> dict[int, int]:
    """GPU start → CPU start of the call that launched it, for every kernel of the export."""
    con = sqlite3.connect(path)
    rows = con.execute("SELECT k.start, r.start FROM CUPTI_ACTIVITY_KIND_KERNEL AS k JOIN CUPTI_ACTIVITY_KIND_RUNTIME "
                       "AS r ON r.correlationId = k.correlationId AND r.globalTid >> 24 = k.globalPid >> 24")
    out = dict(rows.fetchall())
    con.close()
    return out


def _sql_ranges(path: Path, names: tuple[str, ...]) -> list[tuple[int, int, str]]:
    con = sqlite3.connect(path)
    marks = ",".join("?" * len(names))
    rows = con.execute(f"SELECT n.start, n.end, s.value FROM NVTX_EVENTS AS n JOIN StringIds AS s ON s.id = n.textId "
                       f"WHERE s.value IN ({marks}) AND n.end > n.start ORDER BY n.start", names).fetchall()
    con.close()
    return rows


def _holding(ranges: list[tuple[int, int, str]], time: int) -> int | None:
    """The position of the range (sorted, not overlapping) that holds `time`."""
    i = bisect.bisect_right([start for start, _, _ in ranges], time) - 1
    return i if i >= 0 and time <= ranges[i][1] else None


def test_each_kernel_carries_the_step_and_phase_it_was_launched_in():
    found = load(MLP)
    kernels = label(found, found.kernels, "kernel").kernels
    assert set(LABELS) <= set(kernels.columns)
    launches = _sql_launches(MLP)
    steps = _sql_ranges(MLP, ("step",))
    phases = _sql_ranges(MLP, ("fwd", "bwd", "opt"))
    expected_steps, expected_phases = [], []
    for start in kernels["start_ns"]:
        launch = launches[start]
        step, phase = _holding(steps, launch), _holding(phases, launch)
        expected_steps.append(NO_STEP if step is None else step)
        expected_phases.append(OUTSIDE_PHASES if phase is None else phases[phase][2])
    assert kernels["step"].tolist() == expected_steps and set(expected_steps) == {0, 1}
    assert kernels["phase"].astype(str).tolist() == expected_phases
    assert set(expected_phases) == {"fwd", "bwd", "opt"}
    # Each kernel's enclosing ranges, outermost first; the backward's on the autograd thread's own.
    forward = kernels[kernels["range"].astype(str).str.endswith("blocks.0.forward")]
    assert len(forward) and set(forward["range"].astype(str)) == {"step/fwd/blocks.forward/blocks.0.forward"}
    assert set(kernels.loc[kernels["phase"] == "bwd", "range"].astype(str)) >= {"blocks.backward/blocks.0.backward"}
    assert kernels["module"].isna().all() and kernels["stream"].equals(found.kernels["stream"])


def test_ranks_and_steps_of_a_two_process_report():
    found = load(TWO_GPUS)
    kernels = label(found, found.kernels, "kernel").kernels
    recorded = {process: found.process_ranks[process] for process in kernels["process"].unique()}
    assert sorted(recorded.values()) == [0, 1]
    assert (kernels["rank"].astype(int) == kernels["process"].map(recorded)).all()
    assert (kernels["node"].astype(int) == 0).all()
    assert set(kernels["step"]) == {2, 3}  # the recorder's numbers: the capture held steps 2 and 3
    given = label(found, found.kernels, "kernel", rank=5).kernels
    assert (given["rank"] == 5).all()


def test_labels_are_the_same_a_block_of_kernels_at_a_time(monkeypatch):
    found = load(TWO_GPUS)
    whole = label(found, found.kernels, "kernel").kernels
    monkeypatch.setattr(trace, "BLOCK_ROWS", 7)
    blocked = label(found, found.kernels, "kernel").kernels
    for column in ("category", *LABELS):
        assert whole[column].equals(blocked[column]), column


def test_cpu_operators_are_labelled_and_the_tables_sum_the_labels():
    found = load(CPU_MLP)
    summary = summarize_trace(found)
    operators = summary.attributed
    assert summary.basis == "cpu_ops" and set(LABELS) <= set(operators.columns)
    steps = summary.steps.set_index("step")
    per_step = operators[operators["step"] != NO_STEP].groupby("step")["total_ns"].sum() / 1e6
    assert per_step.to_numpy() == pytest.approx(steps["operator_ms"].to_numpy())
    for phase in summary.phase_names:
        mine = operators[(operators["phase"] == phase).to_numpy()]
        assert summary.phase_ns()[phase]["total_ns"] == int(mine["total_ns"].sum()) > 0
        within = mine[mine["step"] != NO_STEP].groupby("step")["total_ns"].sum().to_numpy() / 1e6
        assert within == pytest.approx(steps[f"{phase}_ms"].to_numpy())
    assert np.isin(operators["step"].unique(), [NO_STEP, *steps.index]).all()
