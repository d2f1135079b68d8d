"""The step rule and the phase rule: which ranges of a recording are its phases and which are its steps, the same
for kernel reports, memory snapshots and the recorded process's own step count.

Phases (`names.PHASE_RULE`), the first rule that finds some:
1. `asked`: the ranges asked for by name (`--phase`).
2. `marked`: the ranges opened with `profiler_kit.phase` (kind `phase`).
3. `program`: the program's own ranges (kind `program`: `torch.cuda.nvtx`, the `nvtx` package,
   `record_function`) on each process's main thread (the thread whose outermost such ranges last longest): the
   outermost ones, or, while those all have one name (a `step` holding `fwd`, `bwd`, `opt`), the ranges
   directly inside them; where some are named `forward`, `backward` or `optimizer_step`, those and the ranges
   beside them (same thread, same enclosing range).
4. `auto`: the recorder's automatic marks (kind `auto`): `forward`, `backward`, `optimizer_step`, and `eval`.
5. `none`: no phases.
PyTorch's and libraries' ranges (`names.LIBRARY_RANGES`) are never phases, nor is `warmup`. More than
MAX_FOUND_PHASES names at the phase level are not phases (e.g. one range per item). A phase's ranges are those
of its name and of the kind the rule chose (every kind when asked for by name), a range inside one of its own
name being part of that one.

Steps, the first that finds some (at least two for a kernel report's per-step table), the outermost of them (a
range of the step's name nested inside a step is part of that step):
1. the ranges that directly hold the phases, when they all have one name (`ProfilerStep#N` counted as one
   name): the program's `step`, or the recorder's step marks around its automatic marks;
2. the recorder's step marks (kind `auto`, named `step`: the steps of `profiler_kit.capture`, else one per
   optimizer step of the program);
3. torch.profiler's `ProfilerStep#N` ranges.
Steps are numbered as the program counted them, from 0: the number the recorder gave each step range, else
that of the recorder's step mark inside each of the program's own step ranges, else the N of `ProfilerStep#N`;
else from 0 at each process's first step recorded (`StepNumbers.own` False). A recording whose ranges hold no
steps but tell its optimizer steps apart (a memory snapshot's) has a step end with each optimizer step
(`steps_ending_with`: with gradient accumulation, several forwards and backwards run in one step).

An evaluation pass is no training step: in a process whose recorder's step marks hold optimizer steps, the step
marks after the last one that holds one and holding no backward (forwards with no optimizer step after them) are
`eval` (`evaluation`), with the recorder's marks inside them: a phase of their own, outside the steps.

A recorded process counts its steps the same way while it runs (`window_steps`): the one range name at the top
of its main thread when it repeats, else the recorder's step marks, else its most frequent top-level range.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from profiler_kit.names import (
    BACKWARD,
    EVAL,
    KIND_AUTO,
    KIND_PHASE,
    KIND_PROGRAM,
    LIBRARY_RANGES,
    NOT_PHASES,
    OPTIMIZER_STEP,
    PHASES,
    STEP,
)
from profiler_kit.range_tree import NO_NUMBER, RangeTree

ASKED, MARKED, PROGRAM, AUTO, NONE = "asked", "marked", "program", "auto", "none"
# The kind of range each rule takes its phases from (asked: any).
RULE_KINDS = {MARKED: KIND_PHASE, PROGRAM: KIND_PROGRAM, AUTO: KIND_AUTO}
# More distinct names than this at the phase level are not phases (e.g. one range per item); none are chosen.
MAX_FOUND_PHASES = 64
PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")
# What each rule's note says chose the phases.
RULE_NOTES = {
    ASKED: "the --phase ranges",
    MARKED: "the ranges opened with profiler_kit.phase",
    PROGRAM: "the program's own ranges (no profiler_kit.phase ranges)",
    AUTO: "the recorder's automatic marks (the program has no ranges of its own)",
}


def library(name: str) -> bool:
    """Whether PyTorch or a library opened a range of this name by itself (never a phase)."""
    return bool(LIBRARY_RANGES.match(name))


def never_a_phase(name: str) -> bool:
    """Library ranges and `warmup` are never phases."""
    return library(name) or name in NOT_PHASES


def builtin(name: str) -> bool:
    return name in PHASES


def step_key(name: str) -> str:
    """A range name with torch.profiler's step number dropped (`ProfilerStep#7` → `ProfilerStep#`)."""
    return "ProfilerStep#" if PROFILER_STEP.match(name) else name


def descends(names_at_level: set[str], holds_inner: bool) -> bool:
    """Whether the phases lie one level further in: the ranges at this level all have one name, not a built-in
    phase's, and hold candidates (a `step` holding `fwd`, `bwd`, `opt`); those ranges are then steps."""
    return len(names_at_level) == 1 and not names_at_level & set(PHASES) and holds_inner


@dataclass
class PhaseChoice:
    """The phases of a recording, in order of their first range, which rule chose them, notes about the choice,
    and `level`: the ranges at the phase level (None when asked for by name)."""

    names: list[str]
    rule: str
    notes: list[str] = field(default_factory=list)
    level: np.ndarray | None = None


def choose_phases(tree: RangeTree, asked: list[str] | tuple[str, ...] | None = None) -> PhaseChoice:
    """The phases of a recording by the rule of this module's docstring."""
    if asked is not None:
        return PhaseChoice(list(dict.fromkeys(asked)), ASKED)
    marked = tree.kind == KIND_PHASE
    own = (tree.kind == KIND_PROGRAM) & ~tree.named(never_a_phase)
    auto = (tree.kind == KIND_AUTO) & tree.named(lambda name: builtin(name) or name == EVAL)
    if marked.any():
        chosen, rule = _level(tree, marked), MARKED
    elif (own & tree.named(builtin)).any():
        chosen, rule = _beside_builtin(tree, own), PROGRAM
    elif own.any():
        chosen, rule = _level(tree, own), PROGRAM
    else:
        chosen, rule = auto, AUTO
    ids = np.flatnonzero(chosen)
    found = list(dict.fromkeys(tree.name[ids[np.argsort(tree.start[ids], kind="stable")]]))
    notes = []
    if len(found) > MAX_FOUND_PHASES:
        notes.append(f"the ranges at the phase level have {len(found):,} names, too many to be phases: none are "
                     "shown per phase; name the phases with --phase")
        found = []
    if not found:
        return PhaseChoice([], NONE, notes)
    return PhaseChoice(found, rule, [f"phases: {RULE_NOTES[rule]}", *notes], chosen)


def other_kinds(tree: RangeTree, choice: PhaseChoice) -> np.ndarray:
    """The ranges named like a phase but of another kind than the rule chose (the recorder's automatic
    `forward` does not add to a program's own `forward` phase, nor theirs to the marks'): they are not the
    phases' ranges. None of them when the phases were asked for by name."""
    kind = RULE_KINDS.get(choice.rule)
    if kind is None:
        return np.zeros(len(tree), dtype=bool)
    return tree.named(set(choice.names).__contains__) & (tree.kind != kind)


def phase_ranges(tree: RangeTree, choice: PhaseChoice) -> np.ndarray:
    """The phases' ranges: those named like a phase and not of another kind (`other_kinds`), less any inside a
    range of its own name on its thread (part of that one)."""
    named = tree.named(set(choice.names).__contains__) & ~other_kinds(tree, choice)
    return named & ~tree.inside_own_name(named)


def _main_threads(tree: RangeTree, outer: np.ndarray) -> np.ndarray:
    """Which ranges lie on their process's main thread: the one whose `outer` ranges last longest (of equal ones,
    the lowest thread id)."""
    threads, position = np.unique(np.stack([tree.process, tree.thread], axis=1), axis=0, return_inverse=True)
    position = position.ravel()
    span = np.zeros(len(threads), dtype=np.int64)
    np.add.at(span, position, np.where(outer, tree.end - tree.start, 0))
    main = np.zeros(len(threads), dtype=bool)
    heads = np.flatnonzero(np.r_[True, threads[1:, 0] != threads[:-1, 0]])
    for first, last in zip(heads, [*heads[1:], len(threads)], strict=True):
        main[first + int(np.argmax(span[first:last]))] = True
    return main[position]


def _level(tree: RangeTree, candidate: np.ndarray) -> np.ndarray:
    """The phase level among the `candidate` ranges: the outermost ones on each process's main thread, then one
    level further in while `descends`."""
    enclosing = tree.nearest_in(candidate)
    outer = candidate & (enclosing < 0) & ~tree.named(NOT_PHASES.__contains__)
    level = outer & _main_threads(tree, outer)
    while True:
        inner = candidate & np.isin(enclosing, np.flatnonzero(level))
        if not descends(set(tree.name[level]), bool(inner.any())):
            return level
        level = inner


def _beside_builtin(tree: RangeTree, own: np.ndarray) -> np.ndarray:
    """The built-in names and the program's ranges beside them: same thread, same enclosing range."""
    enclosing = tree.nearest_in(own)
    named = own & tree.named(builtin)
    threads = tree.threads()
    same_thread = np.isin(threads, threads[named])
    return own & same_thread & np.isin(enclosing, enclosing[named]) & ~tree.named(NOT_PHASES.__contains__)


def evaluation_steps(optimizer: np.ndarray, backward: np.ndarray) -> np.ndarray:
    """Which steps (one process's, in run order; whether each holds an optimizer step, a backward) are an
    evaluation pass: those after the last one holding an optimizer step and holding no backward; none when no
    step holds an optimizer step."""
    optimizer, backward = np.asarray(optimizer, dtype=bool), np.asarray(backward, dtype=bool)
    out = np.zeros(len(optimizer), dtype=bool)
    if optimizer.any():
        last = int(np.flatnonzero(optimizer)[-1])
        out[last + 1:] = ~backward[last + 1:]
    return out


def evaluation(tree: RangeTree) -> np.ndarray:
    """Which ranges are an evaluation pass (`evaluation_steps` over each process's recorder's step marks), and the
    recorder's marks that lie inside one in time: the ranges to name EVAL."""
    auto = tree.kind == KIND_AUTO
    steps = np.flatnonzero(auto & (tree.name == STEP))
    out = np.zeros(len(tree), dtype=bool)
    for process in np.unique(tree.process[steps]):
        mine = steps[tree.process[steps] == process]
        mine = mine[np.argsort(tree.start[mine], kind="stable")]
        held = {}
        for name in (OPTIMIZER_STEP, BACKWARD):
            marks = np.flatnonzero(auto & (tree.name == name) & (tree.process == process))
            at = np.searchsorted(tree.start[mine], tree.start[marks], side="right") - 1
            inside = (at >= 0) & (tree.start[marks] < tree.end[mine[np.maximum(at, 0)]])
            held[name] = np.isin(np.arange(len(mine)), at[inside])
        passes = mine[evaluation_steps(held[OPTIMIZER_STEP], held[BACKWARD])]
        if not len(passes):
            continue
        out[passes] = True
        marks = np.flatnonzero(auto & (tree.process == process) & tree.named(builtin))
        at = np.searchsorted(tree.start[passes], tree.start[marks], side="right") - 1
        out[marks[(at >= 0) & (tree.end[marks] <= tree.end[passes[np.maximum(at, 0)]])]] = True
    return out


def find_steps(tree: RangeTree, phases: list[str], minimum: int = 2) -> np.ndarray:
    """Range ids of the steps (the rule of this module's docstring), by process and start; none unless at least
    `minimum` (a kernel report's per-step table needs two; a memory snapshot often holds one step)."""
    keys = tree.name.copy()
    keys[tree.named(PROFILER_STEP.match)] = step_key("ProfilerStep#0")
    is_phase = tree.named(set(phases).__contains__)
    holders = tree.nearest_in(~is_phase)[is_phase]
    holders = holders[holders >= 0]
    recorded = (tree.kind == KIND_AUTO) & (tree.name == STEP)
    if len(holders) and len(set(keys[holders])) == 1:
        threads = tree.threads()
        chosen = (keys == keys[holders[0]]) & np.isin(threads, threads[holders])
    elif recorded.any():  # the recorder's step marks: the program's steps
        chosen = recorded
    else:
        chosen = tree.named(PROFILER_STEP.match)
    chosen = chosen & (tree.nearest_in(chosen) < 0)
    ids = np.flatnonzero(chosen)
    ids = ids[np.lexsort((tree.start[ids], tree.process[ids]))]
    return ids if len(ids) >= minimum else ids[:0]


@dataclass
class StepNumbers:
    """The number of each step as the program counted it, and whether the recording said so (`own`), else
    counted from 0 at each process's first step recorded."""

    numbers: np.ndarray
    own: bool


def step_numbers(tree: RangeTree, steps: np.ndarray) -> StepNumbers:
    """The number of each step (range ids `steps`, as `find_steps` orders them) by the rule of this module's
    docstring."""
    numbers = tree.number[steps]
    if (numbers != NO_NUMBER).all():
        return StepNumbers(numbers, True)
    marked = _numbers_of_marks_inside(tree, steps)
    if marked is not None:
        return StepNumbers(marked, True)
    profiler = [PROFILER_STEP.match(name) if isinstance(name, str) else None for name in tree.name[steps]]
    if all(profiler):
        return StepNumbers(np.array([int(m.group(1)) for m in profiler], dtype=np.int64), True)
    processes = tree.process[steps]
    counted = np.zeros(len(steps), dtype=np.int64)
    for process in np.unique(processes):
        mine = processes == process
        counted[mine] = np.arange(int(mine.sum()))
    return StepNumbers(counted, False)


def _numbers_of_marks_inside(tree: RangeTree, steps: np.ndarray) -> np.ndarray | None:
    """The numbers of the program's own steps (`profiler_kit.phase("step")`, a `record_function("step")`) taken
    from the recorder's numbered step marks: each step must hold the middle of exactly one mark of its process;
    None where any does not."""
    numbered = np.flatnonzero((tree.kind == KIND_AUTO) & (tree.name == STEP) & (tree.number != NO_NUMBER))
    out = np.empty(len(steps), dtype=np.int64)
    processes = tree.process[steps]
    for process in np.unique(processes):
        marks = numbered[tree.process[numbered] == process]
        middles = (tree.start[marks] + tree.end[marks]) // 2
        order = np.argsort(middles, kind="stable")
        middles, numbers = middles[order], tree.number[marks][order]
        mine = processes == process
        first = np.searchsorted(middles, tree.start[steps][mine], "left")
        last = np.searchsorted(middles, tree.end[steps][mine], "right")
        if not (last - first == 1).all():
            return None
        out[mine] = numbers[first]
    return out


def steps_ending_with(ends: list[bool]) -> list[int] | None:
    """The step of each phase (in run order) when each step ends with a phase that `ends` marks (an optimizer
    step), counted from 0; None when none does."""
    if not any(ends):
        return None
    return np.r_[0, np.cumsum(ends[:-1], dtype=np.int64)].tolist()


def window_steps(top_level: Counter, marked_steps: int) -> int | None:
    """How many steps a recorded process ran, from the names of the ranges it opened at the top of its main thread
    (`top_level`, library ranges left out: `counted_at_top`) and how many of the recorder's step marks it
    opened: the one top-level name when it repeats (a `step` holding the rest), else the step marks, else the most
    frequent top-level name; None without any."""
    most = top_level.most_common(1)[0][1] if top_level else None
    if len(top_level) == 1 and most > 1:
        return most
    return marked_steps or most


def counted_at_top(name: str) -> bool:
    """Whether a range opened at the top of the main thread may be a step (not PyTorch's or a library's)."""
    return not library(name)
