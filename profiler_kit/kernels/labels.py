"""The labels of every kernel (or, in a trace without kernels, every CPU operator call) of a report, set once here:
every analysis (summary, idle, steps, ranks, collectives, what-if, compare, timeline, charts) groups by them and
none works out a step or a phase again.

A kernel is labelled by the ranges open, on any thread of its process, when the call that launched it started
(`attribution`), in one pass over the kernels, a block at a time:
- `category`: what it computes (`categories`); launched inside PyTorch's `Optimizer.step#…`, optimizer work
  whatever its name (communication stays communication);
- `step`: the program's number of the step range it was launched in (`phase_rule`), NO_STEP outside the steps;
- `phase`: the phase whose range it was launched in (a categorical of the phase names and OUTSIDE_PHASES; the
  innermost phase range where several hold it, then the one opened last), OUTSIDE_PHASES when in none, missing
  (NaN) where its launch is unknown; `phase_range`: the id of that range in `Labelled.index` (NO_RANGE none);
- `rank`, `node`: its process's place in the job (categoricals; missing where unknown);
- `stream`: the CUDA stream it ran on (for CPU operators: the thread), as the reader gave it;
- `range`: the path of the innermost range open at its launch (`step/fwd/block0`; the innermost of several
  threads', then the one opened last), missing where none was;
- `module`: the module that launched it, missing until a reader knows it.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from profiler_kit.kernels import trace
from profiler_kit.kernels.attribution import RangeIndex, launches_in
from profiler_kit.kernels.categories import CATEGORIES, COMMUNICATION, OPTIMIZER_STEP, categorize
from profiler_kit.kernels.trace import NO_LAUNCH, KernelTrace
from profiler_kit.names import EVAL, KIND_PROGRAM
from profiler_kit.phase_rule import (
    NONE,
    PhaseChoice,
    choose_phases,
    evaluation,
    find_steps,
    library,
    other_kinds,
    phase_ranges,
    step_numbers,
)

OUTSIDE_PHASES = "(outside phases)"
NO_STEP = -1
NO_RANGE = -1
PATH_SEPARATOR = "/"
LABELS = ("step", "phase", "phase_range", "rank", "node", "stream", "range", "module")
# A range outside the phases holding more than this share of the time is named in a note.
LEFT_OUT_PCT = 5.0
NUMBERED_HERE = ("steps are numbered from 0 at the first one recorded: the report does not say which of the "
                 "program's steps they were")
EVALUATED = (f"forwards after the last optimizer step, with no optimizer step after them, are an evaluation pass: "
             f"phase {EVAL!r}, no step")
OVERLAPPING = "some NVTX ranges of one thread overlap without nesting; kernels in them may be missed"


@dataclass
class Labelled:
    """A report's timed events with their labels (`kernels`: the reader's columns, `category` and LABELS), the
    ranges the labels refer to (`index`: None without ranges or launches), the phase choice, the phases'
    ranges (`phase_mask`, over `index`: `phase_rule.phase_ranges`), and `steps`: one row per step (`range`: its
    id in `index`, `process`, `step`, `start_ns`, `end_ns`), by process and start; `own_numbers`: whether the
    step numbers are the program's (`phase_rule.step_numbers`)."""

    kernels: pd.DataFrame
    index: RangeIndex | None
    choice: PhaseChoice
    steps: pd.DataFrame
    phase_mask: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    own_numbers: bool = True
    range_steps: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))  # `_range_steps`
    notes: list[str] = field(default_factory=list)  # about the ranges and the phase choice, in order

    @property
    def phases(self) -> list[str]:
        return self.choice.names

    def step_rows(self, kernels: pd.DataFrame | None = None) -> np.ndarray:
        """The row of `steps` each kernel (of `kernels`, else all) was launched in; -1 outside the steps."""
        kernels = self.kernels if kernels is None else kernels
        step = kernels["step"].to_numpy()
        out = np.full(len(kernels), -1, dtype=np.int32)
        processes = kernels["process"].to_numpy() if len(self.steps) else None
        for process, mine in self.steps.groupby("process", sort=False).indices.items():
            rows = np.flatnonzero((processes == process) & (step != NO_STEP))
            out[rows] = mine[pd.Index(self.steps["step"].to_numpy()[mine]).get_indexer(step[rows])]
        return out

    def within_steps(self, rows: np.ndarray) -> np.ndarray:
        """Which ranges of `index` lie, in time, inside the steps of `steps` rows `rows` (not the steps
        themselves)."""
        return np.isin(self.range_steps, rows)

    def phase_codes(self, kernels: pd.DataFrame | None = None) -> np.ndarray:
        """Each kernel's phase as its position in `phases` (len(phases): OUTSIDE_PHASES; -1: launch unknown)."""
        kernels = self.kernels if kernels is None else kernels
        return kernels["phase"].cat.codes.to_numpy()


def grouped(owners: np.ndarray) -> Iterator[np.ndarray]:
    """The rows whose owner (a label: a step's row, a phase range's id) is set (≥ 0), a group of whole owners at
    a time holding about a quarter of `trace.BLOCK_ROWS` rows (an owner with more is a group alone), rows in order
    within an owner: what a caller holds at once grows with a group, not with the report. At least one group."""
    order = np.argsort(owners, kind="stable")
    if len(order) < 2**31:
        order = order.astype(np.int32)
    mine = owners[order]
    first = int(np.searchsorted(mine, 0))
    order, mine = order[first:], mine[first:]
    heads = np.flatnonzero(np.r_[True, mine[1:] != mine[:-1]]) if len(mine) else np.zeros(1, dtype=np.int64)
    group = heads // max(trace.BLOCK_ROWS // 4, 1)
    cuts = heads[np.flatnonzero(np.r_[True, group[1:] != group[:-1]])]
    yield from np.split(order, cuts[1:])


def label(report: KernelTrace, events: pd.DataFrame, kind: str, phases: list[str] | tuple[str, ...] | None = None,
          rank: int | None = None) -> Labelled:
    """`events` (the trace's kernels, or its CPU operator calls when `kind` is `cpu_op`) labelled by the rules of
    this module's docstring; `phases` asked for by name (None: by `phase_rule`), `rank` the job's rank of every
    event (None: the RANK each process recorded)."""
    labelled = ranges_of(report, "launch_ns" in events.columns, phases)
    index, steps = labelled.index, labelled.steps
    category = categorize(events["name"], kind)
    count = len(events)
    if index is None:
        phase_range, step, path = np.full(count, NO_RANGE, dtype=np.int32), np.full(count, NO_STEP, np.int32), None
        phase = _missing(count)
    else:
        numbers = np.full(len(index), NO_STEP, dtype=np.int32)
        numbers[steps["range"].to_numpy()] = steps["step"].to_numpy()
        inner, phase_range, step, optimizer = _sweep(events, index, labelled.phase_mask, numbers)
        path = _paths(index, inner)
        del inner
        codes = category.codes.copy()
        codes[optimizer & (codes != CATEGORIES.index(COMMUNICATION))] = CATEGORIES.index("optimizer")
        category = pd.Categorical.from_codes(codes, categories=list(CATEGORIES))
        phase = _phase_labels(events, index, labelled.phases, phase_range)
    ranks, nodes = _places(events, report, rank)
    labelled.kernels = events.assign(category=category, step=step, phase=phase, phase_range=phase_range,
                                     rank=ranks, node=nodes, range=_missing(count) if path is None else path,
                                     module=_missing(count))
    return labelled


def ranges_of(report: KernelTrace, launches: bool, phases: list[str] | tuple[str, ...] | None = None) -> Labelled:
    """What the labels refer to, of a report's ranges alone (no kernels labelled yet): the ranges (None without
    ranges, or without `launches` to place in them), the phases and their ranges, and the steps."""
    has_ranges = report.ranges is not None and len(report.ranges) > 0
    index = RangeIndex(report.ranges) if has_ranges and launches else None
    steps = pd.DataFrame({column: pd.Series(dtype=np.int64) for column in ("range", "process", "step", "start_ns",
                                                                           "end_ns")})
    if index is None:
        return Labelled(pd.DataFrame(), None, PhaseChoice([], NONE), steps)
    notes = [OVERLAPPING] if index.overlapping else []
    passes = evaluation(index)
    if passes.any():
        names = index.ranges["name"].to_numpy(dtype=object).copy()
        names[passes] = EVAL
        index = RangeIndex(index.ranges.assign(name=names))
        notes.append(EVALUATED)
    choice = choose_phases(index, phases)
    notes += choice.notes
    other = other_kinds(index, choice)
    if other.any():
        index = RangeIndex(index.ranges[~other])
    ids = find_steps(index, choice.names)
    numbered = step_numbers(index, ids)
    steps = pd.DataFrame({"range": ids, "process": index.process[ids], "step": numbered.numbers,
                          "start_ns": index.start[ids], "end_ns": index.end[ids]})
    return Labelled(pd.DataFrame(), index, choice, steps, phase_mask=phase_ranges(index, choice),
                    own_numbers=numbered.own or not len(ids), notes=notes, range_steps=_range_steps(index, ids))


def _range_steps(index: RangeIndex, steps: np.ndarray) -> np.ndarray:
    """For every range, the row of the step (of the step range ids `steps`, in order) that holds it in time, -1
    for none and for the steps themselves: by time, not nesting, since the recorder's step marks are a lane apart
    from the program's thread."""
    out = np.full(len(index), -1, dtype=np.int32)
    for process in np.unique(index.process[steps]):
        rows = np.flatnonzero(index.process[steps] == process)
        rows = rows[np.argsort(index.start[steps[rows]], kind="stable")]
        mine = steps[rows]
        candidates = np.flatnonzero(index.process == process)
        # The last step to start at or before each range; steps of one process do not overlap.
        at = np.searchsorted(index.start[mine], index.start[candidates], side="right") - 1
        ok = at >= 0
        ok[ok] = index.end[candidates[ok]] <= index.end[mine[at[ok]]]
        out[candidates[ok]] = rows[at[ok]]
    out[steps] = -1
    return out


def phase_ranges_at(labelled: Labelled, times_ns: np.ndarray, process: np.ndarray) -> np.ndarray:
    """The phase range (by the rule of `phase`) holding each of the times of other events than the labelled ones
    (calls that launch no kernel), NO_RANGE where none does."""
    times_ns, process = np.asarray(times_ns, dtype=np.int64), np.asarray(process, dtype=np.int64)
    out = np.full(len(times_ns), NO_RANGE, dtype=np.int64)
    ids = np.flatnonzero(labelled.phase_mask)
    for _layer, points, held in labelled.index._pairs(times_ns, process, ids, times_ns != NO_LAUNCH):
        _deeper(labelled.index, out, points, held)
    return out


def _sweep(kernels: pd.DataFrame, index: RangeIndex, phase_mask: np.ndarray,
           numbers: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """In one pass over the kernels (a block at a time) and every range: each kernel's innermost range and phase
    range (NO_RANGE for none), the number of its step (`numbers`: each range's, NO_STEP but for steps) and
    whether an `Optimizer.step#…` range holds it."""
    count = len(kernels)
    inner = np.full(count, NO_RANGE, dtype=np.int32)
    phase = np.full(count, NO_RANGE, dtype=np.int32)
    step = np.full(count, NO_STEP, dtype=np.int32)
    optimizer = np.zeros(count, dtype=bool)
    is_step = numbers != NO_STEP
    is_optimizer = index.named(OPTIMIZER_STEP.match)
    order = _inward(index)
    launch = kernels["launch_ns"].to_numpy()
    every = np.arange(len(index), dtype=np.int64)
    # A quarter block at a time: every range is searched, and each kernel's innermost one kept.
    for _layer, points, ids in index._pairs(launch, kernels["process"].to_numpy(), every, launch != NO_LAUNCH,
                                            max(trace.BLOCK_ROWS // 4, 1)):
        ids = ids.astype(np.int32)
        _deeper(order, inner, points, ids)
        mine = phase_mask[ids]
        if mine.any():
            _deeper(order, phase, points[mine], ids[mine])
        mine = is_step[ids]
        if mine.any():
            step[points[mine]] = numbers[ids[mine]]
        mine = is_optimizer[ids]
        if mine.any():
            optimizer[points[mine]] = True
    return inner, phase, step, optimizer


def _inward(index: RangeIndex) -> np.ndarray:
    """Each range's place in the order deeper on its thread, then opened later: of two ranges holding a kernel,
    the one placed later is its innermost."""
    order = np.empty(len(index), dtype=np.int32)
    order[np.lexsort((index.start, index.depth))] = np.arange(len(index), dtype=np.int32)
    return order


def _deeper(order: np.ndarray, current: np.ndarray, points: np.ndarray, ids: np.ndarray) -> None:
    """Set `current[points]` to `ids` where none is set yet or where the range of `ids` lies further in
    (`_inward`) than the one set."""
    held = current[points]
    wins = held < 0
    have = ~wins
    if have.any():
        wins[have] = order[ids[have]] > order[held[have]]
    current[points[wins]] = ids[wins]


def _paths(index: RangeIndex, inner: np.ndarray) -> pd.Categorical:
    """The path of each kernel's innermost range (`inner`), from its thread's outermost range down."""
    codes = np.full(len(index) + 1, -1, dtype=np.int64)  # the last one: no range
    known: dict[tuple[int, object], int] = {}
    texts: list[str] = []
    for level in range(int(index.depth.max(initial=-1)) + 1):
        for r in np.flatnonzero(index.depth == level).tolist():
            up = int(index.parent[r])
            key = (int(codes[up]) if up >= 0 else -1, index.name[r])
            if key not in known:
                known[key] = len(texts)
                texts.append(str(index.name[r]) if key[0] < 0 else f"{texts[key[0]]}{PATH_SEPARATOR}{index.name[r]}")
            codes[r] = known[key]
    return pd.Categorical.from_codes(codes.astype(_smallest(len(texts)))[inner],
                                     categories=pd.Index(texts, dtype=object))


def _smallest(count: int) -> type:
    """The smallest signed integer type that holds the codes of `count` categories and -1."""
    return next(t for t in (np.int8, np.int16, np.int32) if count < np.iinfo(t).max) if count < 2**31 else np.int64


def _phase_labels(kernels: pd.DataFrame, index: RangeIndex, names: list[str],
                  phase_range: np.ndarray) -> pd.Categorical:
    """Each kernel's phase (the name of its phase range), OUTSIDE_PHASES where its launch is known and in none;
    missing where its launch is unknown or the report has no phases."""
    categories = pd.Index([*names, OUTSIDE_PHASES], dtype=object)
    if not names:
        return pd.Categorical.from_codes(np.full(len(kernels), -1, dtype=np.int8), categories=categories)
    # Each range's phase (the last one: no range, outside the phases), then each kernel's, a lookup per kernel.
    of_range = np.r_[pd.Index(names).get_indexer(index.name), len(names)].astype(_smallest(len(categories)))
    codes = of_range[phase_range]
    codes[kernels["launch_ns"].to_numpy() == NO_LAUNCH] = -1
    return pd.Categorical.from_codes(codes, categories=categories)


def _places(kernels: pd.DataFrame, report: KernelTrace, rank: int | None) -> tuple[pd.Categorical, pd.Categorical]:
    """Each kernel's rank (`rank`, else its process's recorded RANK) and node, missing where unknown."""
    count = len(kernels)
    process = kernels["process"].to_numpy() if "process" in kernels.columns else None

    def per_process(known: dict[int, int], everyone: int | None) -> pd.Categorical:
        if everyone is not None:
            return pd.Categorical.from_codes(np.zeros(count, dtype=np.int8), categories=[everyone])
        values = sorted(set(known.values()))
        if process is None or not values:
            return _missing(count)
        codes = np.full(count, -1, dtype=_smallest(len(values)))
        for proc, value in known.items():
            codes[process == proc] = values.index(value)
        return pd.Categorical.from_codes(codes, categories=values)

    return per_process(report.process_ranks, rank), per_process(report.process_nodes, None)


def _missing(count: int) -> pd.Categorical:
    return pd.Categorical.from_codes(np.full(count, -1, dtype=np.int8), categories=pd.Index([], dtype=object))


def left_out(labelled: Labelled, kernels: pd.DataFrame, total_ns: int, timed: str) -> list[str]:
    """Notes naming each range outside the phases that holds more than LEFT_OUT_PCT of `total_ns` among the
    kernels launched in no phase (of `kernels`), with the `--phase` options that would include it. Steps and
    ranges enclosing a phase are not candidates (they hold the phases), nor are PyTorch's and libraries'."""
    index, phases = labelled.index, labelled.phases
    outside = np.flatnonzero(labelled.phase_codes(kernels) == len(phases)) if phases else np.empty(0, np.int64)
    if index is None or not total_ns or not len(outside):
        return []
    names = index.names()
    is_phase = names.isin(phases).to_numpy()
    encloses_phase = np.zeros(len(names), dtype=bool)
    up = index.parent[is_phase]
    while len(up := up[up >= 0]):
        encloses_phase[up] = True
        up = index.parent[up]
    eligible = ~is_phase & ~encloses_phase & (index.kind == KIND_PROGRAM) & ~index.named(library)
    eligible[labelled.steps["range"].to_numpy()] = False
    outermost = eligible & (index.nearest_in(eligible) < 0)
    rows, owners = launches_in(kernels.iloc[outside].reset_index(drop=True), index, np.flatnonzero(outermost))
    per_name = pd.DataFrame({"row": rows, "name": names.to_numpy()[owners]}).drop_duplicates()
    times = kernels["total_ns"].to_numpy()[outside][per_name["row"].to_numpy()]
    shares = pd.Series(times).groupby(per_name["name"].to_numpy()).sum() * 100.0 / total_ns
    return [f"range {name!r}, outside the phases, holds {share:.1f}% of the {timed}; "
            f"`{' '.join(f'--phase {shlex.quote(p)}' for p in [*phases, name])}` includes it"
            for name, share in shares.sort_values(ascending=False).items() if share > LEFT_OUT_PCT]
