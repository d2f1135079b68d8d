"""Two kernel summaries side by side: per category, per phase and per kernel, time in each, delta, speedup.

`speedup` is A's time over B's: above 1 means B is faster. With a threshold, the comparison is also a regression
gate: it fails when B's total, or any phase or category that both reports have, takes more than that many
percent longer than A's. Kernels are matched by name, so compare reports
of the same kind (an nsys export with an nsys export): torch.profiler and nsys demangle templates differently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from profiler_kit.kernels.categories import CATEGORIES
from profiler_kit.kernels.summary import DEFAULT_TOP, NS_PER_MS, KernelSummary, display_name
from profiler_kit.render import records

TOTAL = "total"


@dataclass
class Comparison:
    a: KernelSummary
    b: KernelSummary
    categories: pd.DataFrame  # category, a_ns, b_ns (every category, then the total)
    phases: pd.DataFrame  # phase, a_ns, b_ns (phases present in either)
    kernels: pd.DataFrame  # name, category, a_instances, b_instances, a_ns, b_ns (largest first)
    top: int = DEFAULT_TOP
    fail_above_pct: float | None = None

    def gate(self) -> pd.DataFrame:
        """check (`total`, `phase <name>`, `category <name>`), a_ns, b_ns, change_pct, regressed: every figure
        both reports have; `regressed` only with a threshold."""
        both_c = self.categories[(self.categories["a_ns"] > 0) & (self.categories["b_ns"] > 0)]
        both_p = self.phases[(self.phases["a_ns"] > 0) & (self.phases["b_ns"] > 0)]
        checks = pd.DataFrame(
            {
                "check": [TOTAL if c == TOTAL else f"category {c}" for c in both_c["category"]]
                + [f"phase {p}" for p in both_p["phase"]],
                "a_ns": np.concatenate([both_c["a_ns"].to_numpy(), both_p["a_ns"].to_numpy()]).astype(np.int64),
                "b_ns": np.concatenate([both_c["b_ns"].to_numpy(), both_p["b_ns"].to_numpy()]).astype(np.int64),
            }
        )
        checks["change_pct"] = (checks["b_ns"] - checks["a_ns"]) * 100.0 / checks["a_ns"]
        limit = np.inf if self.fail_above_pct is None else self.fail_above_pct
        checks["regressed"] = checks["change_pct"] > limit
        return checks

    @property
    def failed(self) -> bool:
        return self.fail_above_pct is not None and bool(self.gate()["regressed"].any())

    def category_table(self) -> pd.DataFrame:
        used = self.categories[(self.categories[["a_ns", "b_ns"]] > 0).any(axis=1)]
        return _deltas(used)

    def phase_table(self) -> pd.DataFrame:
        return _deltas(self.phases)

    def kernel_table(self, display: bool = False) -> pd.DataFrame:
        top = self.kernels.head(self.top)
        table = _deltas(top)
        if display:
            table["name"] = table["name"].map(display_name)
        return table

    def tables(self, display: bool = False) -> list[tuple[str, pd.DataFrame]]:
        tables = [("Kernel time by category: A vs B", self.category_table())]
        if len(self.phases):
            tables.append(("Per phase: A vs B", self.phase_table()))
        tables.append((f"Top {self.top} kernels (by the larger of A and B)", self.kernel_table(display)))
        if self.fail_above_pct is not None:
            gate = self.gate()
            shown = gate.assign(a_ms=gate["a_ns"] / NS_PER_MS, b_ms=gate["b_ns"] / NS_PER_MS)
            verdict = "FAIL" if self.failed else "pass"
            tables.append((f"Regression gate: B more than {self.fail_above_pct:g}% above A fails: {verdict}",
                           shown[["check", "a_ms", "b_ms", "change_pct", "regressed"]]))
        return tables

    def to_json(self) -> dict[str, Any]:
        return {
            "a": {"path": str(self.a.path), "source": self.a.source},
            "b": {"path": str(self.b.path), "source": self.b.source},
            "categories": records(_deltas(self.categories, keep_ns=True)),
            "phases": records(_deltas(self.phases, keep_ns=True)),
            "top_kernels": records(_deltas(self.kernels.head(self.top), keep_ns=True)),
            "gate": None if self.fail_above_pct is None else {
                "fail_above_pct": self.fail_above_pct,
                "verdict": "fail" if self.failed else "pass",
                "checks": records(self.gate()),
            },
        }

    @property
    def notes(self) -> list[str]:
        """The notes of both summaries, each marked with its side."""
        return [f"A: {note}" for note in self.a.notes] + [f"B: {note}" for note in self.b.notes]

    def caption(self) -> str:
        line = f"A = {self.a.path} ({self.a.source}), B = {self.b.path} ({self.b.source}); speedup = A / B"
        return "\n".join([line] + [f"note: {n}" for n in self.notes])


def compare(a: KernelSummary, b: KernelSummary, top: int = DEFAULT_TOP,
            fail_above_pct: float | None = None) -> Comparison:
    """A and B side by side; with `fail_above_pct`, also the regression gate."""
    cat_a, cat_b = a.category_ns(), b.category_ns()
    categories = pd.DataFrame(
        {
            "category": [*CATEGORIES, TOTAL],
            "a_ns": [*(cat_a[c] for c in CATEGORIES), a.total_ns],
            "b_ns": [*(cat_b[c] for c in CATEGORIES), b.total_ns],
        }
    )
    phase_a, phase_b = a.phase_ns(), b.phase_ns()
    names = list(dict.fromkeys([*phase_a, *phase_b]))
    phases = pd.DataFrame(
        {
            "phase": names,
            "a_ns": [phase_a.get(p, {}).get("total_ns", 0) for p in names],
            "b_ns": [phase_b.get(p, {}).get("total_ns", 0) for p in names],
        }
    )
    kernels = a.kernels.merge(b.kernels, on="name", how="outer", suffixes=("_a", "_b"))
    kernels = pd.DataFrame(
        {
            "name": kernels["name"],
            "category": kernels["category_a"].fillna(kernels["category_b"]),
            "a_instances": kernels["instances_a"].fillna(0).astype(np.int64),
            "b_instances": kernels["instances_b"].fillna(0).astype(np.int64),
            "a_ns": kernels["total_ns_a"].fillna(0).astype(np.int64),
            "b_ns": kernels["total_ns_b"].fillna(0).astype(np.int64),
        }
    )
    order = np.lexsort((kernels["name"].to_numpy(), -np.maximum(kernels["a_ns"], kernels["b_ns"]).to_numpy()))
    return Comparison(a, b, categories, phases, kernels.iloc[order].reset_index(drop=True), top, fail_above_pct)


def _deltas(frame: pd.DataFrame, keep_ns: bool = False) -> pd.DataFrame:
    """Add delta (B − A) and speedup (A / B; empty when either side is 0); ms columns unless `keep_ns`."""
    out = frame.drop(columns=["a_ns", "b_ns"]).reset_index(drop=True)
    a, b = frame["a_ns"].to_numpy(), frame["b_ns"].to_numpy()
    both = (a > 0) & (b > 0)
    speedup = np.divide(a, b, out=np.full(len(a), np.nan), where=both)
    if keep_ns:
        out["a_ns"], out["b_ns"], out["delta_ns"] = a, b, b - a
    else:
        out["a_ms"], out["b_ms"], out["delta_ms"] = a / NS_PER_MS, b / NS_PER_MS, (b - a) / NS_PER_MS
    out["speedup"] = speedup
    return out
