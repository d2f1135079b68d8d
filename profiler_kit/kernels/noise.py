"""Whether a change between two sets of runs is larger than the runs' own noise.

A side is several runs (reports, or the steps of one report); each run gives one value per checked quantity
(the total, each phase, each category, each kernel by normalized name). The rule, per quantity:

- each side's centre is the median of its runs and its noise is the range of its runs (largest − smallest);
- the change is the difference of the medians (B − A);
- the change is real when it is larger than both sides' noise and than the floor (`min_delta_ns`): `regressed`
  when B is slower, `improved` when faster; otherwise `within noise`;
- with `fail_above_pct`, a regression fails the gate when it is also more than that percent of A's median.

With one run on a side that side has no noise estimate (range 0), and the floor alone separates change from
noise. The range is used rather than a standard deviation because sides hold few runs (often 3 to 5), where a
standard deviation is itself noisy; the verdict is then "outside everything either side has shown".
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from profiler_kit.errors import ProfilerKitError
from profiler_kit.steady import beyond_noise

RUN_COLUMNS = ("run", "quantity", "value_ns")
VERDICT_COLUMNS = ("quantity", "a_runs", "a_median_ms", "a_range_ms", "b_runs", "b_median_ms", "b_range_ms",
                   "delta_ms", "delta_pct", "verdict", "failed")
REGRESSED, IMPROVED, WITHIN = "regressed", "improved", "within noise"


def run_frame(runs: list[dict[str, int]]) -> pd.DataFrame:
    """The long form of several runs' {quantity: ns}; a quantity missing from a run counts 0 there."""
    quantities = list(dict.fromkeys(q for run in runs for q in run))
    rows = [(i, q, int(run.get(q, 0))) for i, run in enumerate(runs) for q in quantities]
    return pd.DataFrame(rows, columns=list(RUN_COLUMNS)).astype({"run": np.int64, "value_ns": np.int64})


def _side(runs: pd.DataFrame, quantities: pd.Index) -> pd.DataFrame:
    """Per quantity: number of runs, median and range; a quantity a side never saw is 0 in all its runs."""
    n = runs["run"].nunique()
    wide = runs.pivot_table(index="quantity", columns="run", values="value_ns", aggfunc="sum", fill_value=0)
    wide = wide.reindex(quantities, fill_value=0)
    values = wide.to_numpy(dtype=np.float64)
    return pd.DataFrame({"runs": n, "median": np.median(values, axis=1),
                         "range": values.max(axis=1) - values.min(axis=1)}, index=quantities)


def verdicts(a: pd.DataFrame, b: pd.DataFrame, min_delta_ns: float,
             fail_above_pct: float | None = None) -> pd.DataFrame:
    """One row per quantity of either side (in A's order, then B's new ones): each side's median and range,
    the change, the verdict and whether it fails the gate."""
    if not len(a) or not len(b):
        raise ProfilerKitError("each side of a comparison needs at least one run")
    quantities = pd.Index(list(dict.fromkeys([*a["quantity"], *b["quantity"]])), name="quantity")
    sa, sb = _side(a, quantities), _side(b, quantities)
    delta = sb["median"] - sa["median"]
    real = beyond_noise(delta, sa["range"], sb["range"], min_delta_ns)
    verdict = np.select([real & (delta > 0), real & (delta < 0)], [REGRESSED, IMPROVED], WITHIN)
    pct = 100.0 * delta / sa["median"].where(sa["median"] > 0)
    failed = np.zeros(len(quantities), dtype=bool)
    if fail_above_pct is not None:
        failed = (verdict == REGRESSED) & ((pct > fail_above_pct) | sa["median"].eq(0)).to_numpy()
    return pd.DataFrame({
        "quantity": quantities.to_numpy(),
        "a_runs": sa["runs"].to_numpy(),
        "a_median_ms": sa["median"].to_numpy() / 1e6,
        "a_range_ms": sa["range"].to_numpy() / 1e6,
        "b_runs": sb["runs"].to_numpy(),
        "b_median_ms": sb["median"].to_numpy() / 1e6,
        "b_range_ms": sb["range"].to_numpy() / 1e6,
        "delta_ms": delta.to_numpy() / 1e6,
        "delta_pct": pct.to_numpy(),
        "verdict": verdict,
        "failed": failed,
    })


def runs_to_json(runs: pd.DataFrame) -> list[dict[str, Any]]:
    """Runs as JSON records, one object per run: {quantity: ns}."""
    return [dict(zip(group["quantity"], map(int, group["value_ns"]), strict=True))
            for _, group in runs.groupby("run", sort=True)]


def runs_from_json(doc: Any, origin: str) -> pd.DataFrame:
    """Runs from `runs_to_json`'s records, each value checked."""
    if not isinstance(doc, list) or not doc:
        raise ProfilerKitError(f"{origin}: `runs` must be a non-empty list of {{quantity: ns}} objects")
    for i, run in enumerate(doc):
        if not isinstance(run, dict) or not all(
                isinstance(q, str) and isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63
                for q, v in run.items()):
            raise ProfilerKitError(f"{origin}: runs[{i}] is not an object of quantity → non-negative integer ns")
    return run_frame(doc)
