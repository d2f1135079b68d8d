"""Which NVTX ranges are a report's phases: one rule for every report, whatever recorded it (`names.PHASE_RULE`).

1. `asked`: the ranges asked for by name (`--phase`).
2. `marked`: else the ranges opened with `profiler_kit.phase` (the readers give them the kind `phase`: the
   `profiler_kit` NVTX domain in an nsys export, the phase list in a torch.profiler trace's metadata).
3. `program`: else the program's own ranges (`torch.cuda.nvtx`, the `nvtx` package, `record_function`) on each
   process's main thread: the outermost ones, or, while those all have one name (a `step` holding `fwd`, `bwd`,
   `opt`), the ranges directly inside them; where some are named `forward`, `backward` or `optimizer_step`,
   those and the ranges beside them.
4. `auto`: else the recorder's automatic marks (kind `auto`): `forward`, `backward`, `optimizer_step`.
5. `none`: else no phases.

PyTorch's and libraries' ranges (`names.LIBRARY_RANGES`: `Optimizer.*`, `ProfilerStep#…`, `aten::…`,
`autograd::…`, NCCL's `nccl…`, `c10d::…`, DDP's, FSDP's, compiled regions) are never phases and never proposed
in the note about a range left out; `warmup` is never a phase.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from profiler_kit.kernels.attribution import RangeIndex, launches_in
from profiler_kit.names import KIND_AUTO, KIND_PHASE, KIND_PROGRAM, LIBRARY_RANGES, NOT_PHASES, PHASES

BUILTIN_PHASES = PHASES
# More distinct names than this at the phase level are not phases (e.g. one range per item); none are chosen.
MAX_FOUND_PHASES = 64
# A range outside the phases holding more than this share of the time is named in a note.
LEFT_OUT_PCT = 5.0
# What each rule's note says chose the phases (the rule itself: `names.PHASE_RULE`).
RULE_NOTES = {
    "asked": "the --phase ranges",
    "marked": "the ranges opened with profiler_kit.phase",
    "program": "the program's own ranges (no profiler_kit.phase ranges)",
    "auto": "the recorder's automatic marks (the program has no ranges of its own)",
}


@dataclass
class PhaseChoice:
    """The phases of a report, in order, and which rule chose them (`asked`, `marked`, `program`, `auto` or
    `none`)."""

    names: list[str]
    rule: str
    notes: list[str] = field(default_factory=list)


def _kinds(index: RangeIndex) -> np.ndarray:
    ranges = index.ranges
    if "kind" in ranges.columns:
        return ranges["kind"].to_numpy(dtype=object)
    return np.where(index.marked(), KIND_PHASE, KIND_PROGRAM)


def library(names: pd.Series) -> np.ndarray:
    """Which range names PyTorch or a library opened by themselves."""
    return names.str.match(LIBRARY_RANGES, na=False).to_numpy(dtype=bool)


def choose_phases(index: RangeIndex, asked: list[str] | tuple[str, ...] | None = None) -> PhaseChoice:
    """The phases of a report by the rule of this module's docstring."""
    if asked is not None:
        return PhaseChoice(list(dict.fromkeys(asked)), "asked")
    names = index.names()
    kinds = _kinds(index)
    marked = kinds == KIND_PHASE
    own = (kinds == KIND_PROGRAM) & ~library(names) & ~names.isin(NOT_PHASES).to_numpy()
    auto = (kinds == KIND_AUTO) & names.isin(PHASES).to_numpy()
    if marked.any():
        chosen, rule = _level(index, marked), "marked"
    elif (own & names.isin(PHASES).to_numpy()).any():
        chosen, rule = _beside_builtin(index, own), "program"
    elif own.any():
        chosen, rule = _level(index, own), "program"
    else:
        chosen, rule = auto, "auto"
    found = list(dict.fromkeys(index.ranges.loc[chosen].sort_values("start_ns", kind="stable")["name"]))
    notes = []
    if len(found) > MAX_FOUND_PHASES:
        notes.append(f"the ranges at the phase level have {len(found):,} names, too many to be phases: none are "
                     "shown per phase; name the phases with --phase")
        found = []
    if not found:
        return PhaseChoice([], "none", notes)
    return PhaseChoice(found, rule, [f"phases: {RULE_NOTES[rule]}", *notes])


def phase_index(index: RangeIndex, choice: PhaseChoice) -> RangeIndex:
    """The ranges the phases are counted in: of the ranges named like a phase, only those of the kind the rule
    chose (the recorder's automatic `forward` does not add to a program's own `forward` phase, nor theirs to the
    marks'); every range when the phases were asked for by name."""
    kind = {"marked": KIND_PHASE, "program": KIND_PROGRAM, "auto": KIND_AUTO}.get(choice.rule)
    if kind is None:
        return index
    other = index.names().isin(choice.names).to_numpy() & (_kinds(index) != kind)
    return RangeIndex(index.ranges[~other]) if other.any() else index


def _main_threads(index: RangeIndex, outer: np.ndarray) -> np.ndarray:
    """Which ranges lie on their process's main thread: the one whose `outer` ranges last longest."""
    ranges = index.ranges
    span = (ranges["end_ns"] - ranges["start_ns"]).where(outer, 0)
    per_thread = span.groupby([ranges["process"], ranges["thread"]]).sum()
    main = per_thread.groupby(level=0).idxmax().to_list()
    return pd.MultiIndex.from_frame(ranges[["process", "thread"]]).isin(main)


def _level(index: RangeIndex, candidate: np.ndarray) -> np.ndarray:
    """The phase level among the `candidate` ranges: the outermost ones on each process's main thread; while
    they all have one name and hold candidates, the candidates directly inside them (a built-in name stops
    the descent)."""
    names = index.names().to_numpy()
    enclosing = index.nearest_in(candidate)
    outer = candidate & (enclosing < 0) & ~np.isin(names, NOT_PHASES)
    level = outer & _main_threads(index, outer)
    while True:
        at_level = set(names[level])
        inner = candidate & np.isin(enclosing, np.flatnonzero(level))
        if len(at_level) != 1 or at_level & set(BUILTIN_PHASES) or not inner.any():
            return level
        level = inner


def _beside_builtin(index: RangeIndex, own: np.ndarray) -> np.ndarray:
    """The built-in names and the program's ranges beside them: same thread, same enclosing range."""
    names = index.names()
    enclosing = index.nearest_in(own)
    builtin = own & names.isin(BUILTIN_PHASES).to_numpy()
    threads = pd.MultiIndex.from_frame(index.ranges[["process", "thread"]])
    same_thread = threads.isin(threads[builtin])
    return own & same_thread & np.isin(enclosing, enclosing[builtin]) & ~names.isin(NOT_PHASES).to_numpy()


def left_out(kernels: pd.DataFrame, index: RangeIndex, phases: list[str], steps: np.ndarray,
             outside: np.ndarray, total_ns: int, timed: str) -> list[str]:
    """Notes naming each range outside the phases that holds more than LEFT_OUT_PCT of `total_ns` among the
    kernels launched in no phase (`outside`: their rows), with the `--phase` options that would include it.
    Steps (`steps`: range ids) and ranges enclosing a phase are not candidates: they hold the phases."""
    if not total_ns or not len(outside):
        return []
    names = index.names()
    is_phase = names.isin(phases).to_numpy()
    encloses_phase = np.zeros(len(names), dtype=bool)
    up = index.parent[is_phase]
    while len(up := up[up >= 0]):
        encloses_phase[up] = True
        up = index.parent[up]
    eligible = ~is_phase & ~encloses_phase & (_kinds(index) == KIND_PROGRAM) & ~library(names)
    eligible[steps] = False
    outermost = eligible & (index.nearest_in(eligible) < 0)
    rows, owners = launches_in(kernels.iloc[outside].reset_index(drop=True), index, np.flatnonzero(outermost))
    per_name = pd.DataFrame({"row": rows, "name": names.to_numpy()[owners]}).drop_duplicates()
    times = kernels["total_ns"].to_numpy()[outside][per_name["row"].to_numpy()]
    shares = pd.Series(times).groupby(per_name["name"].to_numpy()).sum() * 100.0 / total_ns
    return [f"range {name!r}, outside the phases, holds {share:.1f}% of the {timed}; "
            f"`{' '.join(f'--phase {shlex.quote(p)}' for p in [*phases, name])}` includes it"
            for name, share in shares.sort_values(ascending=False).items() if share > LEFT_OUT_PCT]
