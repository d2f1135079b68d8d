"""The step and phase rule (`phase_rule`) on range layouts built here: the order of its rules, library ranges never
phases, the phase level, which ranges are a phase's, which are the steps and how they are numbered, the recorded
process's own step count, and one answer for a kernel report and a memory snapshot of the same ranges."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from profiler_kit.kernels.labels import EVALUATED, ranges_of
from profiler_kit.kernels.trace import KernelTrace, kernel_frame, range_frame
from profiler_kit.memory import phases as memory_phases
from profiler_kit.phase_rule import (
    MAX_FOUND_PHASES,
    choose_phases,
    descends,
    evaluation,
    evaluation_steps,
    find_steps,
    phase_ranges,
    step_numbers,
    steps_ending_with,
    window_steps,
)
from profiler_kit.range_tree import NO_NUMBER, RangeTree

OPT_STEP = "Optimizer.step#AdamW.step"


def tree(names: list[str], starts: list[int], ends: list[int], threads: list[int] | None = None,
         kinds: list[str] | None = None, numbers: list[int | None] | None = None,
         processes: list[int] | None = None) -> RangeTree:
    count = len(names)
    return RangeTree(names, starts, ends, processes or [1] * count, threads or [1] * count, kinds,
                     None if numbers is None else [NO_NUMBER if n is None else n for n in numbers])


def named(t: RangeTree, ids: np.ndarray) -> list[str]:
    return t.name[ids].tolist()


def test_ranges_nest_per_thread():
    t = tree(["step", "fwd", "layer", "bwd", "other"], [0, 1, 2, 5, 1], [9, 4, 3, 8, 6], threads=[1, 1, 1, 1, 2])
    assert t.depth.tolist() == [0, 1, 2, 1, 0] and t.parent.tolist() == [-1, 0, 1, 0, -1]
    assert not t.overlapping
    assert t.nearest_in(np.array([True, False, False, False, False])).tolist() == [-1, 0, 0, 0, -1]
    assert tree(["a", "b", "c"], [0, 2, 4], [3, 5, 6]).overlapping


def test_rule_order():
    names = ["step", "fwd", "bwd", "forward", "step", "fwd", "bwd"]
    starts, ends = [0, 1, 5, 2, 10, 11, 15], [9, 4, 8, 3, 19, 14, 18]
    # `step` holds fwd and bwd: the ranges inside it.
    assert choose_phases(tree(["step", "fwd", "bwd", "step", "fwd", "bwd"], [0, 1, 5, 10, 11, 15],
                              [9, 4, 8, 19, 14, 18])).names == ["fwd", "bwd"]
    # A built-in name (`forward`) picks its level: the ranges beside it.
    choice = choose_phases(tree(names, starts, ends))
    assert choice.rule == "program" and choice.names == ["forward"]
    # Marks win over both; asked names over everything.
    kinds = ["phase" if m else "program" for m in [False, False, True, False, False, False, True]]
    marked = choose_phases(tree(names, starts, ends, kinds=kinds))
    assert marked.rule == "marked" and marked.names == ["bwd"]
    assert choose_phases(tree(names, starts, ends), ["step"]).names == ["step"]
    # The recorder's marks come last: the program's own ranges win over them, and they are the phases of a
    # program without ranges (its `step` marks are its steps, never a phase).
    auto = ["step", "forward", "backward", "optimizer_step"]
    both = tree([*auto, "fwd"], [0, 1, 3, 5, 1], [9, 2, 4, 6, 2], threads=[-2, -2, -2, -2, 1],
                kinds=["auto"] * 4 + ["program"])
    assert choose_phases(both).rule == "program" and choose_phases(both).names == ["fwd"]
    alone = choose_phases(tree(auto, [0, 1, 3, 5], [9, 2, 4, 6], kinds=["auto"] * 4))
    assert alone.rule == "auto" and alone.names == ["forward", "backward", "optimizer_step"]


def test_pytorch_and_library_ranges_are_never_phases():
    names = ["ProfilerStep#3", "fwd", "aten::mm", "bwd", "opt", OPT_STEP, "ProfilerStep#4", "fwd", "bwd", "opt",
             OPT_STEP]
    starts = [0, 1, 2, 4, 6, 7, 10, 11, 14, 16, 17]
    ends = [9, 3, 3, 5, 8, 8, 19, 13, 15, 18, 18]
    assert choose_phases(tree(names, starts, ends)).names == ["fwd", "bwd", "opt"]
    library = ["ncclAllGather", "nccl:all_reduce", "c10d::allreduce_", "autograd::engine::evaluate_function: X",
               "DistributedDataParallel.forward", "FSDP::pre_forward", OPT_STEP, "ProfilerStep#1", "warmup"]
    count = len(library)
    only = choose_phases(tree(library, list(range(0, 2 * count, 2)), list(range(1, 2 * count, 2))))
    assert only.names == [] and only.rule == "none"


def test_too_many_names_at_the_phase_level_are_no_phases():
    count = MAX_FOUND_PHASES + 1
    choice = choose_phases(tree([f"item{i}" for i in range(count)], list(range(0, 2 * count, 2)),
                                list(range(1, 2 * count, 2))))
    assert choice.names == [] and choice.rule == "none" and "too many" in choice.notes[0]


def test_the_level_descends_through_ranges_of_one_name_only():
    assert descends({"train_step"}, True)
    assert not descends({"train_step"}, False)  # nothing inside: they are the phases
    assert not descends({"forward"}, True)  # a built-in name is a phase
    assert not descends({"fwd", "bwd"}, True)
    # `run` ⊃ `step` ⊃ fwd, bwd: two levels down.
    nested = tree(["run", "step", "fwd", "bwd", "step", "fwd", "bwd"], [0, 1, 2, 4, 10, 11, 13],
                  [30, 9, 3, 5, 19, 12, 14])
    assert choose_phases(nested).names == ["fwd", "bwd"]
    assert named(nested, find_steps(nested, ["fwd", "bwd"])) == ["step", "step"]


def test_the_phases_are_on_the_main_thread():
    """A data-loader thread's own ranges last less than the main thread's: they are no phases."""
    t = tree(["fwd", "bwd", "load", "load", "load"], [0, 10, 0, 5, 12], [9, 30, 4, 11, 20], threads=[1, 1, 7, 7, 7])
    assert choose_phases(t).names == ["fwd", "bwd"]


def test_a_phases_ranges_are_of_its_kind_and_a_range_inside_one_of_its_name_is_part_of_it():
    names = ["forward", "forward", "forward", "backward", "forward"]
    t = tree(names, [0, 1, 0, 10, 20], [9, 5, 9, 15, 25], threads=[1, 1, -2, -2, 1],
             kinds=["program", "program", "auto", "auto", "program"])
    choice = choose_phases(t)
    assert choice.rule == "program" and choice.names == ["forward"]
    assert np.flatnonzero(phase_ranges(t, choice)).tolist() == [0, 4]
    asked = choose_phases(t, ["forward", "backward"])
    assert np.flatnonzero(phase_ranges(t, asked)).tolist() == [0, 2, 3, 4]


def test_steps_hold_the_phases_else_the_recorders_step_marks_else_profiler_steps():
    program = tree(["step", "fwd", "bwd", "step", "fwd", "bwd"], [0, 1, 5, 10, 11, 15], [9, 4, 8, 19, 14, 18])
    assert named(program, find_steps(program, ["fwd", "bwd"])) == ["step", "step"]
    marks = tree(["step", "step", "fwd", "fwd"], [0, 10, 1, 11], [9, 19, 4, 14], threads=[-2, -2, 1, 1],
                 kinds=["auto", "auto", "program", "program"], numbers=[4, 5, None, None])
    steps = find_steps(marks, ["fwd"])
    assert named(marks, steps) == ["step", "step"] and step_numbers(marks, steps).numbers.tolist() == [4, 5]
    profiler = tree(["ProfilerStep#7", "fwd", "ProfilerStep#8", "fwd"], [0, 1, 10, 11], [9, 4, 19, 14])
    steps = find_steps(profiler, ["fwd"])
    assert named(profiler, steps) == ["ProfilerStep#7", "ProfilerStep#8"]
    assert step_numbers(profiler, steps).numbers.tolist() == [7, 8]
    # One step is no per-step table of a kernel report, but is a memory snapshot's step.
    one = tree(["step", "fwd", "bwd"], [0, 1, 5], [9, 4, 8])
    assert not len(find_steps(one, ["fwd", "bwd"])) and named(one, find_steps(one, ["fwd", "bwd"], minimum=1)) == [
        "step"]


def test_steps_are_numbered_as_the_program_counted_them():
    """The program's `step` ranges take the numbers of the recorder's step marks inside them; without marks
    they are counted from 0 at each process's first step, and the numbers are not the program's own."""
    names = ["step", "fwd", "step", "fwd", "step", "step"]
    t = tree(names, [0, 1, 10, 11, 2, 12], [9, 4, 19, 14, 8, 18], threads=[1, 1, 1, 1, -2, -2],
             kinds=["program"] * 4 + ["auto"] * 2, numbers=[None] * 4 + [3, 4])
    steps = find_steps(t, ["fwd"])
    assert step_numbers(t, steps).numbers.tolist() == [3, 4] and step_numbers(t, steps).own
    two = tree(["step", "fwd", "step", "fwd", "step", "fwd"], [0, 1, 10, 11, 0, 1], [9, 4, 19, 14, 9, 4],
               processes=[1, 1, 1, 1, 2, 2])
    counted = step_numbers(two, find_steps(two, ["fwd"]))
    assert counted.numbers.tolist() == [0, 1, 0] and not counted.own


def test_a_recorded_process_counts_its_steps_by_the_rule():
    assert window_steps(Counter({"step": 5}), 3) == 5  # the one top-level name repeats: the program's steps
    assert window_steps(Counter({"fwd": 2, "bwd": 2}), 3) == 3  # else the step marks
    assert window_steps(Counter({"fwd": 2, "data": 4}), 0) == 4  # else the most frequent top-level name
    assert window_steps(Counter({"step": 1}), 0) == 1
    assert window_steps(Counter(), 0) is None


def test_a_snapshot_and_a_kernel_report_of_the_same_ranges_get_the_same_phases_and_steps():
    from profiler_kit.kernels.attribution import RangeIndex
    from profiler_kit.kernels.trace import range_frame

    names = ["train_step", "fwd", "aten::mm", "bwd", OPT_STEP, "train_step", "fwd", "bwd", OPT_STEP, "warmup"]
    starts = [10, 11, 12, 14, 17, 20, 21, 24, 27, 0]
    ends = [19, 13, 13, 16, 18, 29, 23, 26, 28, 9]
    index = RangeIndex(range_frame(names, starts, ends, [1] * 10, [1] * 10))
    choice = choose_phases(index)
    steps = find_steps(index, choice.names)
    chosen = memory_phases._choose([memory_phases._Range(n, s, e) for n, s, e in zip(names, starts, ends,
                                                                                    strict=True)])
    assert choice.names == ["fwd", "bwd"] and [r.name for r in chosen.phases] == ["fwd", "bwd", "fwd", "bwd"]
    assert index.names()[steps].tolist() == [r.name for r in chosen.steps] == ["train_step", "train_step"]
    assert step_numbers(index, steps).numbers.tolist() == [r.step for r in chosen.steps] == [0, 1]


def test_without_step_ranges_a_step_ends_with_each_optimizer_step():
    assert steps_ending_with([False, False, True, False, False, False, True]) == [0, 0, 0, 1, 1, 1, 1]
    assert steps_ending_with([False, True, True]) == [0, 0, 1]
    assert steps_ending_with([False, False]) is None


def test_forwards_after_the_last_optimizer_step_are_an_evaluation_pass():
    # Recorder's marks: two training steps (forward, backward, optimizer step), then two steps of forwards only.
    names, starts, ends = [], [], []
    for s in (0, 10):
        names += ["step", "forward", "backward", "optimizer_step"]
        starts += [s, s + 1, s + 3, s + 6]
        ends += [s + 9, s + 3, s + 6, s + 8]
    for s in (20, 30):
        names += ["step", "forward"]
        starts += [s, s + 1]
        ends += [s + 9, s + 8]
    t = tree(names, starts, ends, kinds=["auto"] * len(names))
    assert named(t, np.flatnonzero(evaluation(t))) == ["step", "forward", "step", "forward"]
    assert t.start[evaluation(t)].tolist() == [20, 21, 30, 31]
    # Forward-only steps before an optimizer step (or with no optimizer step anywhere) train or infer.
    assert evaluation_steps([False, True, False], [False, True, True]).tolist() == [False, False, False]
    assert evaluation_steps([False, False], [False, False]).tolist() == [False, False]
    assert evaluation_steps([True, False, False], [True, True, False]).tolist() == [False, False, True]
    # In a kernel report they are phase `eval`, no step.
    labelled = ranges_of(KernelTrace("synthetic", Path("eval"), kernel_frame([], []),
                                     range_frame(names, starts, ends, [1] * len(names), [1] * len(names),
                                                 ["auto"] * len(names))), True)
    assert len(labelled.steps) == 2 and "eval" in labelled.choice.names and EVALUATED in labelled.notes
