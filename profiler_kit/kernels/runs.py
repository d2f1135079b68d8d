"""A side of a comparison: the runs of its reports, each a value per quantity (the total, each phase, each category,
each kernel by what it computes), one run per step of a report when every report has a per-step table (its steps:
the kernels' `step` labels), else one per report; or a side saved as JSON (`kernels compare --baseline`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd

from profiler_kit.errors import ProfilerKitError
from profiler_kit.kernels.labels import Labelled
from profiler_kit.kernels.names import match, normalized
from profiler_kit.kernels.noise import run_frame, runs_from_json, runs_to_json
from profiler_kit.kernels.steps import steady_rows
from profiler_kit.kernels.trace import blocks, summed
from profiler_kit.render import records

TOTAL = "total"
STEP, REPORT = "step", "report"


class Summarized(Protocol):
    """What a side needs of a summarized report (`summary.KernelSummary`)."""

    path: Path
    kernels: pd.DataFrame  # one row per kernel name: name, category, instances, total_ns
    attributed: pd.DataFrame | None  # one row per execution, labelled
    labelled: Labelled | None
    phase_names: list[str]
    steps: pd.DataFrame | None  # the per-step table (`kernels.steps`), its `state` telling the steady steps


def report_runs(summary: Summarized) -> tuple[list[dict[str, int]], str]:
    """The runs of one summarized report, each {quantity: ns} (`total`, `phase P`, `category C`, `kernel K` with
    K the normalized name), and their unit: one per step when the report has a per-step table, else one.
    Kernels are summed by integer codes (of their step, category and normalized name), never by name per row."""
    kernels, labelled = summary.attributed, summary.labelled
    if kernels is None:
        kernels = summary.kernels
    if labelled is not None and len(labelled.steps):
        run_of = labelled.step_rows(kernels)
        count, unit = len(labelled.steps), STEP
    else:
        run_of, count, unit = np.zeros(len(kernels), dtype=np.int64), 1, REPORT
    runs: list[dict[str, int]] = [{TOTAL: 0} for _ in range(count)]
    names = kernels["name"].astype("category")
    kernel_of, folded = pd.factorize(normalized(pd.Series(names.cat.categories, dtype=object)))
    name_codes, categories = names.cat.codes.to_numpy(), kernels["category"].astype("category")
    ns = kernels["total_ns"].to_numpy()
    for prefix, codes, labels in ((None, np.zeros(len(ns), dtype=np.int8), [TOTAL]),
                                  ("category ", categories.cat.codes.to_numpy(), categories.cat.categories),
                                  ("kernel ", None, folded)):
        _add_runs(runs, prefix, labels, ((run_of[block], kernel_of[name_codes[block]] if codes is None
                                          else codes[block], ns[block]) for block in blocks(len(ns))))
    if labelled is not None and labelled.index is not None and summary.phase_names:
        codes = labelled.phase_codes(kernels)
        rows = np.flatnonzero((codes >= 0) & (codes < len(summary.phase_names)))
        _add_runs(runs, "phase ", summary.phase_names, ((run_of[rows[block]], codes[rows[block]], ns[rows[block]])
                                                        for block in blocks(len(rows))))
    return runs, unit


def steady_runs(summary: Summarized, runs: list[dict[str, int]]) -> list[dict[str, int]]:
    """A report's per-step runs less its warm-up and one-off steps (all of them when none is steady)."""
    steady = steady_rows(summary.steps) if summary.steps is not None else np.ones(len(runs), dtype=bool)
    if not steady.any():
        return runs
    return [run for run, kept in zip(runs, steady, strict=True) if kept]


def _add_runs(runs: list[dict[str, int]], prefix: str | None, labels: Sequence,
              parts: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
    """Into each run, the time of each label (`prefix` + label; the label alone without a prefix) its kernels
    have, labels in name order. `parts`: the run (below 0: in no run), label code and time of each kernel, a
    block of kernels at a time."""
    order = np.array(sorted(range(len(labels)), key=lambda i: str(labels[i])), dtype=np.int64)
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    width = max(len(labels), 1)

    def cells(run: np.ndarray, codes: np.ndarray, ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ran = run >= 0
        return run[ran].astype(np.int64) * width + rank[codes[ran]], ns[ran]

    keys, (sums,) = summed((cells(*part) for part in parts), 1)
    for key, value in zip(keys.tolist(), sums.tolist(), strict=True):
        label = str(labels[order[key % width]])
        runs[key // width][label if prefix is None else prefix + label] = value


@dataclass
class Side:
    """One side of a comparison: its runs (`kernels.noise.run_frame`), their unit, the kernels it names
    (kernel, category, names), and where it came from."""

    label: str
    origin: str
    runs: pd.DataFrame
    unit: str
    kernel_names: pd.DataFrame
    summaries: list[Summarized] = field(default_factory=list)

    @property
    def run_count(self) -> int:
        return int(self.runs["run"].nunique())

    @property
    def total_ns(self) -> int:
        """The median total over the runs."""
        return self.medians(TOTAL).get("", 0)

    def medians(self, prefix: str) -> dict[str, int]:
        """Median ns over the runs of each quantity that starts with `prefix` (the prefix removed)."""
        chosen = self.runs[self.runs["quantity"].str.startswith(prefix)]
        wide = chosen.pivot_table(index="quantity", columns="run", values="value_ns", aggfunc="sum",
                                  fill_value=0).reindex(columns=range(self.run_count), fill_value=0)
        return {q[len(prefix):]: int(np.median(v)) for q, v in zip(wide.index, wide.to_numpy(), strict=True)}

    def present(self, prefix: str) -> set[str]:
        """The quantities that start with `prefix` (the prefix removed) that some run of this side has, whatever
        their time: a kernel in one step of five has a median of 0 and is still there."""
        quantities = self.runs["quantity"].drop_duplicates()
        return {q[len(prefix):] for q in quantities[quantities.str.startswith(prefix)]}

    def to_json(self) -> dict[str, Any]:
        return {"origin": self.origin, "unit": self.unit, "runs": runs_to_json(self.runs),
                "kernels": records(self.kernel_names)}


def side_of(summaries: list[Summarized], label: str) -> Side:
    """A side from summarized reports: every report's steady steps as runs when each has a per-step table (its
    warm-up and one-off steps left out: `steady_runs`), else one run per report."""
    per_report = [report_runs(s) for s in summaries]
    if all(unit == STEP for _, unit in per_report):
        runs = [run for s, (report, _) in zip(summaries, per_report, strict=True) for run in steady_runs(s, report)]
        unit = STEP
    else:
        runs, unit = [_whole(report) for report, _ in per_report], REPORT
    names = pd.concat([s.kernels[["name", "category", "total_ns"]] for s in summaries], ignore_index=True)
    info = match(names, names.iloc[0:0])[["kernel", "category", "a_names"]].rename(columns={"a_names": "names"})
    origin = ", ".join(str(s.path) for s in summaries)
    return Side(label, origin, run_frame(runs), unit, info, list(summaries))


def _whole(runs: list[dict[str, int]]) -> dict[str, int]:
    """One run for a whole report: its steps added up."""
    out: dict[str, int] = {}
    for run in runs:
        for q, v in run.items():
            out[q] = out.get(q, 0) + v
    return out


def saved_side(path: Path, doc: object) -> Side:
    """A side from a saved JSON document: a comparison's B side (`kernels compare --format json`), or a
    summary's runs (`kernels summarize --format json`)."""
    saved = None
    if isinstance(doc, dict):
        saved = doc.get("b") if isinstance(doc.get("b"), dict) else doc.get("runs")
    if not isinstance(saved, dict) or saved.get("unit") not in (STEP, REPORT) or "runs" not in saved:
        raise ProfilerKitError(f"{path}: no saved runs (a `kernels compare` or `kernels summarize` JSON document "
                               "with `runs` and `unit`)")
    kernels = saved.get("kernels") or []
    if not isinstance(kernels, list) or not all(isinstance(k, dict) and isinstance(k.get("kernel"), str)
                                                and isinstance(k.get("category"), str) for k in kernels):
        raise ProfilerKitError(f"{path}: `kernels` must be a list of objects with `kernel` and `category`")
    info = pd.DataFrame({"kernel": [k["kernel"] for k in kernels], "category": [k["category"] for k in kernels],
                         "names": [list(map(str, k.get("names") or [])) for k in kernels]})
    return Side("A", str(path), runs_from_json(saved["runs"], str(path)), saved["unit"], info)
