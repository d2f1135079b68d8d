"""Phases per step. One training loop of its own (2 micro-batches of gradient accumulation, activation
checkpointing whose recomputation runs inside the backward, gradient clipping, AdamW, 3 steps whose last
micro-batch is the largest) is written as a snapshot four ways: with the recorder's phases (kinds, steps, times),
with only the automatic marks as annotations, with the program's own range names, and with no marks at all. Each
time the phases are named by step and phase, the peak is the last step's second backward, and every peak per step
and phase equals an independent replay of the trace over that phase's time."""

from contextlib import contextmanager

import numpy as np
import pytest
from memory_replay import replay_levels, replay_range_peak
from snapshot_program import OPTIM, Program

from profiler_kit.memory import analyze
from profiler_kit.memory.analyze import MIB

MODEL = {"filename": "/home/me/model.py", "line": 12, "name": "forward"}
LOOP = {"filename": "/home/me/train.py", "line": 40, "name": "train"}
CHECKPOINT = "/venv/lib/python3.11/site-packages/torch/utils/checkpoint.py"
CLIP = [{"filename": "/venv/lib/python3.11/site-packages/torch/nn/utils/clip_grad.py", "line": 80,
         "name": "_clip_grads_with_norm_"}, LOOP]
# The forward of a checkpointed block runs inside `checkpoint()`; its recomputation runs from the autograd engine's
# thread through the saved-tensor unpack hook.
FORWARD = [MODEL, {"filename": CHECKPOINT, "line": 495, "name": "checkpoint"}, LOOP]
RECOMPUTE = [MODEL, {"filename": CHECKPOINT, "line": 1657, "name": "recompute_fn"},
             {"filename": CHECKPOINT, "line": 1180, "name": "unpack_hook"}]
STEPS, MICRO_BATCHES, FIRST_STEP = 3, 2, 4  # the window starts at the program's fifth step


class Loop:
    """The loop's allocations on a `Program`, with its ranges logged as `how` asks: `recorder` (the recorder's
    phase list, kind `auto`), `auto` (its marks as annotations), `own` (the program's own names as annotations),
    `none`."""

    def __init__(self, how: str) -> None:
        self.how = how
        self.program = Program("python")
        self.program.recording = True
        self.phases: list[dict] = []
        self.step = 0

    @contextmanager
    def range(self, name: str, own: str | None = None, kind: str = "auto"):
        p = self.program
        p.time_us += 1
        start = p.time_us
        annotated = {"auto": name, "own": own}.get(self.how)
        if annotated:
            p.annotations.append({"stage": "START", "name": annotated, "device": 0, "time_us": start})
        yield
        p.time_us += 1
        if annotated:
            p.annotations.append({"stage": "END", "name": annotated, "device": 0, "time_us": p.time_us})
        self.phases.append({"phase": name, "kind": kind, "step": self.step, "start_time_us": start,
                            "end_time_us": p.time_us, "completed": True})

    def run(self) -> None:
        p = self.program
        for step in range(STEPS):
            self.step = FIRST_STEP + step
            with self.range("step"):
                for k in range(MICRO_BATCHES):
                    size = 100_000 * (1 + step) * (1 + k)
                    with self.range("forward", "fwd"):
                        saved = [p.alloc(size, FORWARD) for _ in range(4)]
                    with self.range("backward", "bwd"):
                        for _ in range(2):  # two checkpointed blocks: recomputed, then their gradients
                            again = [p.alloc(size, RECOMPUTE) for _ in range(2)]
                            for addr in again:
                                p.free(addr, engine=True)
                            p.free(saved.pop(), engine=True)
                        grad_scratch = p.alloc(50_000, engine=True)
                        p.free(grad_scratch, engine=True)
                        for addr in saved:
                            p.free(addr, engine=True)
                p.free(p.alloc(4, CLIP), CLIP)  # the gradients' norm, between the backwards and the step
                with self.range("optimizer_step", "opt"):
                    with p.range("Optimizer.step#AdamW.step") if self.how != "recorder" else _nothing():
                        scratch = p.alloc(30_000, OPTIM)
                        p.free(scratch, OPTIM)
                with p.range("Optimizer.zero_grad#AdamW.zero_grad") if self.how != "recorder" else _nothing():
                    pass

    def meta(self) -> dict | None:
        return {"phases": self.phases} if self.how == "recorder" else None


@contextmanager
def _nothing():
    yield


def _loop(how: str) -> Loop:
    loop = Loop(how)
    loop.run()
    return loop


def _expected(loop: Loop) -> dict[tuple[int, str], int]:
    """Per (step counted from 0 in the window, phase): the highest replayed level over its runs' times."""
    levels, times = replay_levels(loop.program.snapshot())
    out: dict[tuple[int, str], int] = {}
    for p in loop.phases:
        key = (p["step"] - FIRST_STEP, p["phase"])
        out[key] = max(out.get(key, 0), replay_range_peak(levels, times, p["start_time_us"], p["end_time_us"]))
    return out


def test_the_recorders_phases_are_named_by_the_programs_steps():
    loop = _loop("recorder")
    report = analyze(loop.program.snapshot(), loop.meta())
    steps = [FIRST_STEP + s for s in range(STEPS)]  # the program's own steps, counted from 0
    expected_labels = []
    for step in steps:
        for k in range(1, MICRO_BATCHES + 1):
            expected_labels += [f"step {step}, forward #{k}", f"step {step}, backward #{k}"]
        expected_labels.append(f"step {step}, optimizer_step")
    assert [s.label for s in report.spans] == expected_labels
    assert {s.source for s in report.spans} == {"auto"}
    data = report.to_json()
    assert (data["peak"]["phase"], data["peak"]["step"]) == (f"step {steps[-1]}, backward #2", steps[-1])
    assert data["steps_from"] == "the recorder's step numbers"
    # The recomputation inside each backward is that backward's: no forward runs inside it.
    assert sum(s.phase == "forward" for s in report.spans) == STEPS * MICRO_BATCHES
    table = report.step_peaks.set_index("step")
    assert list(table.index) == steps
    assert list(table.columns) == ["forward_peak_mib", "backward_peak_mib", "optimizer_step_peak_mib",
                                   "step_peak_mib"]
    levels, times = replay_levels(loop.program.snapshot())
    for (step, phase), peak in _expected(loop).items():
        program_step = step + FIRST_STEP
        column = "step_peak_mib" if phase == "step" else f"{phase}_peak_mib"
        assert table.loc[program_step, column] == peak / MIB, (step, phase)
    assert table["step_peak_mib"].max() * MIB == report.recon.peak_allocated_bytes == levels.max()


@pytest.mark.parametrize("how", ["auto", "own"])
def test_annotations_alone_are_grouped_into_steps(how):
    """The automatic marks in the snapshot (`step` ranges hold them) or the program's own names (`fwd`, `bwd`,
    `opt` holding PyTorch's `Optimizer.step#…`: each step ends with it); PyTorch's own ranges are never phases."""
    loop = _loop(how)
    report = analyze(loop.program.snapshot())
    names = {"forward": "fwd", "backward": "bwd", "optimizer_step": "opt"} if how == "own" else {}
    expected = []
    for step in range(STEPS):
        for k in range(1, MICRO_BATCHES + 1):
            expected += [f"step {step}, {names.get(p, p)} #{k}" for p in ("forward", "backward")]
        expected.append(f"step {step}, {names.get('optimizer_step', 'optimizer_step')}")
    assert [s.label for s in report.spans] == expected
    assert report.placed.steps_from == ("the 'step' ranges" if how == "auto"
                                        else "optimizer steps: each step ends with one")
    assert any(n.startswith("steps: ") and n.endswith("counted from the first in the snapshot")
               for n in report.notes)
    assert report.summary.loc[0, "peak_phase"] == f"step {STEPS - 1}, {names.get('backward', 'backward')} #2"
    table = report.step_peaks.set_index("step")
    for (step, phase), peak in _expected(loop).items():
        column = "step_peak_mib" if phase == "step" else f"{names.get(phase, phase)}_peak_mib"
        if phase != "step" or how == "auto":  # the step's own range is in the snapshot only as a mark
            assert table.loc[step, column] == peak / MIB, (step, phase)


def test_a_snapshot_without_marks_infers_one_forward_and_backward_per_micro_batch():
    """Only PyTorch's optimizer ranges: forward and backward come from the stacks, and the recomputation that
    checkpointing runs from the engine's thread (a Python stack through the unpack hook) stays in the backward,
    so there are as many forwards as micro-batches, not one per recomputed block."""
    loop = _loop("none")
    report = analyze(loop.program.snapshot())
    sources = {s.phase: s.source for s in report.spans}
    assert sources == {"forward": "inferred", "backward": "inferred", "optimizer_step": "pytorch"}
    assert [s.label for s in report.spans] == [
        label for step in range(STEPS) for label in
        [f"step {step}, {p} #{k}" for k in range(1, MICRO_BATCHES + 1) for p in ("forward", "backward")]
        + [f"step {step}, optimizer_step"]]
    assert report.summary.loc[0, "peak_phase"] == f"step {STEPS - 1}, backward #2"
    # Each inferred backward lies inside the recorded one (from its first to its last entry of backward work).
    recorded = [p for p in loop.phases if p["phase"] == "backward"]
    inferred = [s for s in report.spans if s.phase == "backward"]
    times = report.recon.time_us
    for span, phase in zip(inferred, recorded, strict=True):
        assert phase["start_time_us"] <= times[span.start] and times[span.end - 1] <= phase["end_time_us"]


def test_the_recorders_kinds_decide_which_ranges_are_the_phases():
    """`profiler_kit.phase` ranges win over the program's own, which win over the automatic marks; PyTorch's own
    ranges among the program's never win."""
    loop = _loop("recorder")
    auto = loop.phases
    program = [dict(p, phase="train_" + p["phase"], kind="program") for p in auto if p["phase"] != "step"]
    marked = [dict(p, kind="phase") for p in auto if p["phase"] == "forward"]
    pytorch = [dict(p, phase="Optimizer.step#AdamW.step", kind="program") for p in auto
               if p["phase"] == "optimizer_step"]
    snapshot = loop.program.snapshot()
    for phases, names in ((auto + program, {"train_forward", "train_backward", "train_optimizer_step"}),
                          (auto + program + marked, {"forward"}),
                          (auto + pytorch, {"forward", "backward", "optimizer_step"})):
        report = analyze(snapshot, {"phases": phases})
        assert {s.phase for s in report.spans} == names
        assert {s.source for s in report.spans} == {"phase" if phases[-1]["kind"] == "phase" else
                                                    "auto" if phases[-1] in pytorch else "program"}
        assert [s.step for s in report.placed.steps] == [FIRST_STEP + s for s in range(STEPS)]


def test_phases_without_steps_keep_their_run_numbers():
    program = Program("python")
    program.recording = True
    for size in (1000, 3000):
        with program.range("load"):
            program.free(program.alloc(size, [LOOP]), [LOOP])
        with program.range("train"):
            program.free(program.alloc(2 * size, [LOOP]), [LOOP])
    program.free(program.alloc(10_000, [LOOP]), [LOOP])
    report = analyze(program.snapshot())
    assert [s.label for s in report.spans] == ["load #1", "train #1", "load #2", "train #2"]
    assert report.step_peaks is None and report.placed.steps == []
    assert report.summary.loc[0, "peak_phase"] == "outside phases"
    assert [p["peak_allocated_bytes"] for p in report.to_json()["phases"]] == [1000, 2000, 3000, 6000]
    assert np.isnan(report.phases["step"].astype(float)).all()


def test_a_phase_without_allocations_stays_in_its_own_step():
    """A phase that allocates nothing (a fused optimizer step) holds no trace entry: its step comes from the times
    of its range, not from the next entry, which belongs to the next step."""
    program = Program("python")
    program.recording = True
    for _ in range(2):
        with program.range("step"):
            with program.range("forward"):
                program.free(program.alloc(1000, [LOOP]), [LOOP])
            with program.range("optimizer_step"):
                pass
    report = analyze(program.snapshot())
    assert [s.label for s in report.spans] == ["step 0, forward", "step 0, optimizer_step", "step 1, forward",
                                               "step 1, optimizer_step"]
    assert list(report.step_peaks["step"]) == [0, 1]
