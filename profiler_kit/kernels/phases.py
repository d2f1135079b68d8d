"""Which NVTX ranges count for a report's phases (the rule itself: `phase_rule`), and the note about a large
range the phases leave out. PyTorch's and libraries' ranges and `warmup` are never proposed in that note."""

from __future__ import annotations

import shlex

import numpy as np
import pandas as pd

from profiler_kit.kernels.attribution import RangeIndex, launches_in
from profiler_kit.names import KIND_PROGRAM
from profiler_kit.phase_rule import PhaseChoice, library, other_kinds

# A range outside the phases holding more than this share of the time is named in a note.
LEFT_OUT_PCT = 5.0


def phase_index(index: RangeIndex, choice: PhaseChoice) -> RangeIndex:
    """The ranges the phases are counted in: those of `index` less the ranges of another kind than the rule
    chose (`phase_rule.other_kinds`)."""
    other = other_kinds(index, choice)
    return RangeIndex(index.ranges[~other]) if other.any() else index


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
    eligible = ~is_phase & ~encloses_phase & (index.kind == KIND_PROGRAM) & ~index.named(library)
    eligible[steps] = False
    outermost = eligible & (index.nearest_in(eligible) < 0)
    rows, owners = launches_in(kernels.iloc[outside].reset_index(drop=True), index, np.flatnonzero(outermost))
    per_name = pd.DataFrame({"row": rows, "name": names.to_numpy()[owners]}).drop_duplicates()
    times = kernels["total_ns"].to_numpy()[outside][per_name["row"].to_numpy()]
    shares = pd.Series(times).groupby(per_name["name"].to_numpy()).sum() * 100.0 / total_ns
    return [f"range {name!r}, outside the phases, holds {share:.1f}% of the {timed}; "
            f"`{' '.join(f'--phase {shlex.quote(p)}' for p in [*phases, name])}` includes it"
            for name, share in shares.sort_values(ascending=False).items() if share > LEFT_OUT_PCT]
