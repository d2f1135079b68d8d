"""Two kernel summaries side by side: per category, per phase and per kernel, time in each, delta, speedup.

`speedup` is A's time over B's: above 1 means B is faster. With a threshold, the comparison is also a regression
gate: it fails when one of its checks (by default the total and each phase both reports have; also each
category or each kernel when asked) takes more than that many percent longer in B than in A and also more than
an absolute floor (by default 1% of A's total), so that a tiny figure doubling never fails a run. Kernels are
matched by name, so compare reports
of the same kind (an nsys export with an nsys export): torch.profiler and nsys demangle templates differently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from profiler_kit.errors import ProfilerKitError
from profiler_kit.kernels.categories import CATEGORIES
from profiler_kit.kernels.summary import DEFAULT_TOP, NS_PER_MS, KernelSummary, display_name
from profiler_kit.render import records

TOTAL = "total"
GATES = ("total", "phases", "categories", "kernels")
DEFAULT_GATES = ("total", "phases")
# The default floor: a check fails only when B is also this share of A's total above A.
DEFAULT_MIN_DELTA_SHARE = 0.01
# How many of the kernels that moved most a failure names.
MOVERS = 3


@dataclass
class Comparison:
    a: KernelSummary
    b: KernelSummary
    categories: pd.DataFrame  # category, a_ns, b_ns (every category, then the total)
    phases: pd.DataFrame  # phase, a_ns, b_ns (phases present in either)
    kernels: pd.DataFrame  # name, category, a_instances, b_instances, a_ns, b_ns (largest first)
    top: int = DEFAULT_TOP
    fail_above_pct: float | None = None
    gates: tuple[str, ...] = DEFAULT_GATES
    min_delta_ns: int | None = None  # None: DEFAULT_MIN_DELTA_SHARE of A's total

    @property
    def floor_ns(self) -> int:
        """The absolute change below which no check fails."""
        if self.min_delta_ns is not None:
            return self.min_delta_ns
        return int(self.a.total_ns * DEFAULT_MIN_DELTA_SHARE)

    def gate(self) -> pd.DataFrame:
        """check (`total`, `phase <name>`, `category <name>`, `kernel <name>`, as `gates` asks), a_ns, b_ns,
        delta_ns, change_pct, regressed: every such figure both reports have; `regressed` (above the threshold
        and the floor) only with a threshold."""
        cats = self.categories[(self.categories["a_ns"] > 0) & (self.categories["b_ns"] > 0)]
        parts = [
            ("total", cats[cats["category"] == TOTAL].assign(check=TOTAL)),
            ("phases", self.phases.assign(check="phase " + self.phases["phase"].astype(str))),
            ("categories", cats[cats["category"] != TOTAL].assign(check="category " + cats["category"])),
            ("kernels", self.kernels.assign(check="kernel " + self.kernels["name"].astype(str))),
        ]
        chosen = [frame[["check", "a_ns", "b_ns"]] for gate, frame in parts if gate in self.gates]
        checks = pd.concat(chosen, ignore_index=True) if chosen else pd.DataFrame(columns=["check", "a_ns", "b_ns"])
        checks = checks[(checks["a_ns"] > 0) & (checks["b_ns"] > 0)].reset_index(drop=True)
        checks = checks.astype({"a_ns": np.int64, "b_ns": np.int64})
        checks["delta_ns"] = checks["b_ns"] - checks["a_ns"]
        checks["change_pct"] = checks["delta_ns"] * 100.0 / checks["a_ns"]
        limit = np.inf if self.fail_above_pct is None else self.fail_above_pct
        checks["regressed"] = (checks["change_pct"] > limit) & (checks["delta_ns"] > self.floor_ns)
        return checks

    @property
    def failed(self) -> bool:
        return self.fail_above_pct is not None and bool(self.gate()["regressed"].any())

    def failures(self) -> list[str]:
        """One line per failed check: A, B, the change, and the kernels that moved most (of its category, when
        the check is one)."""
        lines = []
        moved = self.kernels.assign(delta_ns=self.kernels["b_ns"] - self.kernels["a_ns"])
        for row in self.gate().query("regressed").itertuples(index=False):
            scope = moved
            if row.check.startswith("category "):
                scope = moved[moved["category"] == row.check.removeprefix("category ")]
            elif row.check.startswith("kernel "):
                scope = moved.iloc[0:0]
            top = scope.nlargest(MOVERS, "delta_ns")
            top = top[top["delta_ns"] > 0]
            movers = ", ".join(f"{display_name(k.name)} {k.delta_ns / NS_PER_MS:+.3f} ms"
                               for k in top.itertuples(index=False))
            lines.append(f"{row.check}: A {row.a_ns / NS_PER_MS:.3f} ms, B {row.b_ns / NS_PER_MS:.3f} ms "
                         f"({row.change_pct:+.1f}%, {row.delta_ns / NS_PER_MS:+.3f} ms)"
                         + (f"; moved most: {movers}" if movers else ""))
        return lines

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
            shown = gate.assign(a_ms=gate["a_ns"] / NS_PER_MS, b_ms=gate["b_ns"] / NS_PER_MS,
                                delta_ms=gate["delta_ns"] / NS_PER_MS)
            verdict = "FAIL" if self.failed else "pass"
            tables.append((f"Regression gate: B more than {self.fail_above_pct:g}% and "
                           f"{self.floor_ns / NS_PER_MS:.3f} ms above A fails: {verdict}",
                           shown[["check", "a_ms", "b_ms", "delta_ms", "change_pct", "regressed"]]))
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
                "min_delta_ns": self.floor_ns,
                "gates": list(self.gates),
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


def compare(a: KernelSummary, b: KernelSummary, top: int = DEFAULT_TOP, fail_above_pct: float | None = None,
            gates: tuple[str, ...] = DEFAULT_GATES, min_delta_ns: int | None = None) -> Comparison:
    """A and B side by side; with `fail_above_pct`, also the regression gate over `gates` (of GATES), whose
    checks fail only above `min_delta_ns` (default: DEFAULT_MIN_DELTA_SHARE of A's total). A GPU report and a
    trace without kernels (CPU operator time) measure different things: ProfilerKitError."""
    if a.basis != b.basis:
        raise ProfilerKitError(f"A is timed by {a.timed.lower()}, B by {b.timed.lower()}: compare reports of the "
                               "same kind (GPU kernels with GPU kernels, a CPU trace with a CPU trace)")
    unknown = set(gates) - set(GATES)
    if unknown:
        raise ValueError(f"unknown gate(s) {', '.join(sorted(unknown))}; choose from {', '.join(GATES)}")
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
    return Comparison(a, b, categories, phases, kernels.iloc[order].reset_index(drop=True), top, fail_above_pct,
                      tuple(gates), min_delta_ns)


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
