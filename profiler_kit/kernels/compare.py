"""Two sides of kernel reports compared: per category, phase and kernel, time in each, delta, speedup, and a
verdict that knows the runs' own noise.

A side is one report or several runs of the same program (or a saved JSON of runs, `--baseline`): `kernels.runs`.
Its runs are the steps of its reports when every report has a per-step table, else the reports themselves; the
tables give each quantity's median over the runs, so a side of one report without steps shows its totals.
Kernels are matched across the sides by what they compute (`kernels.names`: dtypes, sizes, tile shapes and
launcher variants folded), so an fp32 and a bf16 run, or an nsys export and `nsys stats` output, line up; the
kernel table lists the kernels that moved most, enough of them to explain 90% of the total change, and the
kernels only one side has.

`speedup` is A's time over B's: above 1 means B is faster. With a threshold the comparison is a regression gate:
each checked quantity (by default the total and each phase both sides have; also each category or each kernel
when asked) gets a verdict by the rule of `kernels.noise` (a change must pass both sides' run-to-run range and an
absolute floor, by default 1% of A's total), and fails when it regressed by more than the threshold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from profiler_kit.defaults import DEFAULT_GATES, DEFAULT_MIN_DELTA_SHARE
from profiler_kit.errors import ProfilerKitError
from profiler_kit.kernels.categories import CATEGORIES
from profiler_kit.kernels.names import top_movers
from profiler_kit.kernels.noise import REGRESSED, verdicts
from profiler_kit.kernels.runs import STEP, TOTAL, Side, side_of
from profiler_kit.kernels.steps import left_out_note
from profiler_kit.kernels.summary import DEFAULT_TOP, DISPLAY_NAME_CHARS, NS_PER_MS, KernelSummary, display_name
from profiler_kit.names import GATES
from profiler_kit.render import Title, records

# How many of the kernels that moved most a failure names.
MOVERS = 3
# The kernel table explains at least this share of the total change.
EXPLAINED = 0.9
_PREFIX = {"phases": "phase ", "categories": "category ", "kernels": "kernel "}


@dataclass
class Comparison:
    a: Side
    b: Side
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

    def _verdicts(self) -> pd.DataFrame:
        return verdicts(self.a.runs, self.b.runs, self.floor_ns, self.fail_above_pct)

    def gate(self) -> pd.DataFrame:
        """check (`total`, `phase <name>`, `category <name>`, `kernel <name>`, as `gates` asks), the medians
        a_ns and b_ns, each side's range over its runs, delta_ns, change_pct, the verdict, and `regressed`
        (a regression above the threshold; only with a threshold), for every quantity both sides have."""
        table = self._verdicts()
        wanted = np.zeros(len(table), dtype=bool)
        for gate in self.gates:
            wanted |= (table["quantity"] == TOTAL).to_numpy() if gate == "total" else \
                table["quantity"].str.startswith(_PREFIX[gate]).to_numpy()
        table = table[wanted & (table["a_median_ms"] > 0).to_numpy() & (table["b_median_ms"] > 0).to_numpy()]
        ns = {c: np.rint(table[f"{c}_ms"].to_numpy() * NS_PER_MS).astype(np.int64)
              for c in ("a_median", "b_median", "a_range", "b_range", "delta")}
        return pd.DataFrame({
            "check": table["quantity"].to_numpy(), "a_ns": ns["a_median"], "b_ns": ns["b_median"],
            "a_range_ns": ns["a_range"], "b_range_ns": ns["b_range"], "delta_ns": ns["delta"],
            "change_pct": table["delta_pct"].to_numpy(), "verdict": table["verdict"].to_numpy(),
            "regressed": table["failed"].to_numpy() & (table["verdict"] == REGRESSED).to_numpy(),
        })

    @property
    def failed(self) -> bool:
        return self.fail_above_pct is not None and bool(self.gate()["regressed"].any())

    def failures(self) -> list[str]:
        """One line per failed check: A, B (medians, with the runs' range), the change, and the kernels that moved
        most (of its category, when the check is one)."""
        lines = []
        moved = self.kernels().assign(delta_ns=lambda k: k["b_ns"] - k["a_ns"])
        for row in self.gate().query("regressed").itertuples(index=False):
            scope = moved
            if row.check.startswith("category "):
                scope = moved[moved["category"] == row.check.removeprefix("category ")]
            elif row.check.startswith("kernel "):
                scope = moved.iloc[0:0]
            top = scope.nlargest(MOVERS, "delta_ns")
            top = top[top["delta_ns"] > 0]
            movers = ", ".join(f"{display_name(k.kernel, DISPLAY_NAME_CHARS)} {k.delta_ns / NS_PER_MS:+.3f} ms"
                               for k in top.itertuples(index=False))
            spread = (f" (runs: A ±{row.a_range_ns / 2 / NS_PER_MS:.3f}, B ±{row.b_range_ns / 2 / NS_PER_MS:.3f})"
                      if max(self.a.run_count, self.b.run_count) > 1 else "")
            lines.append(f"{row.check}: A {row.a_ns / NS_PER_MS:.3f} ms, B {row.b_ns / NS_PER_MS:.3f} ms "
                         f"({row.change_pct:+.1f}%, {row.delta_ns / NS_PER_MS:+.3f} ms){spread}"
                         + (f"; moved most: {movers}" if movers else ""))
        return lines

    def _pairs(self, prefix: str, column: str, order: list[str]) -> pd.DataFrame:
        a, b = self.a.medians(prefix), self.b.medians(prefix)
        keys = [k for k in dict.fromkeys([*order, *a, *b]) if k in a or k in b]
        return pd.DataFrame({column: keys, "a_ns": [a.get(k, 0) for k in keys], "b_ns": [b.get(k, 0) for k in keys]},
                            ).astype({"a_ns": np.int64, "b_ns": np.int64})

    def categories(self) -> pd.DataFrame:
        """category, a_ns, b_ns: every category, then the total (medians over the runs)."""
        cats = self._pairs("category ", "category", list(CATEGORIES))
        cats = cats.set_index("category").reindex(list(CATEGORIES), fill_value=0).reset_index()
        total = pd.DataFrame({"category": [TOTAL], "a_ns": [self.a.total_ns], "b_ns": [self.b.total_ns]})
        return pd.concat([cats, total], ignore_index=True)

    def phases(self) -> pd.DataFrame:
        order = [p for s in (*self.a.summaries, *self.b.summaries) for p in s.phase_names]
        return self._pairs("phase ", "phase", order)

    def kernels(self) -> pd.DataFrame:
        """kernel, category, a_ns, b_ns, status, a_names, b_names: every kernel of either side by normalized
        name, largest |B − A| first. `status` says which sides have the kernel in their runs (new: only B,
        vanished: only A), not which medians are 0: a kernel both sides ran in few of their steps is in both."""
        pairs = self._pairs("kernel ", "kernel", [])
        info = {side: frame.set_index("kernel") for side, frame in (("a", self.a.kernel_names),
                                                                    ("b", self.b.kernel_names))}
        category = pairs["kernel"].map(info["a"]["category"]).fillna(pairs["kernel"].map(info["b"]["category"]))
        out = pairs.assign(
            category=category.fillna("other").astype(str),
            status=np.select([~pairs["kernel"].isin(self.a.present("kernel ")),
                              ~pairs["kernel"].isin(self.b.present("kernel "))], ["new", "vanished"], "both"),
            a_names=[info["a"]["names"].get(k, []) for k in pairs["kernel"]],
            b_names=[info["b"]["names"].get(k, []) for k in pairs["kernel"]],
        )
        delta = (out["b_ns"] - out["a_ns"]).to_numpy()
        order = np.lexsort((out["kernel"].to_numpy(), -np.abs(delta)))
        return out.iloc[order].reset_index(drop=True)[["kernel", "category", "a_ns", "b_ns", "status", "a_names",
                                                       "b_names"]]

    def movers(self) -> pd.DataFrame:
        """The kernels that moved most: enough to explain EXPLAINED of the total change, at least `top`."""
        return top_movers(self.kernels(), EXPLAINED, at_least=self.top)

    def category_table(self) -> pd.DataFrame:
        cats = self.categories()
        return _deltas(cats[(cats[["a_ns", "b_ns"]] > 0).any(axis=1)])

    def phase_table(self) -> pd.DataFrame:
        return _deltas(self.phases())

    def with_rest(self, shown: pd.DataFrame) -> pd.DataFrame:
        """`shown` (rows of `kernels`) and, when they are not the whole of each side's total, one row more for the
        rest (`kernel` names how many others it holds): each side's total less the rows shown, so that the rows
        add up to the totals and their deltas to the total delta. (A side's total is the median of its runs'
        totals, which the kernels' medians need not add up to.)"""
        rest_a = self.a.total_ns - int(shown["a_ns"].sum())
        rest_b = self.b.total_ns - int(shown["b_ns"].sum())
        others = len(self.kernels()) - len(shown)
        if not (others or rest_a or rest_b):
            return shown.reset_index(drop=True)
        name = f"({others:,} other kernels)" if others else "(the totals' medians less the kernels' medians)"
        rest = pd.DataFrame({"kernel": [name], "category": [""], "a_ns": [rest_a], "b_ns": [rest_b],
                             "status": [""], "a_names": [[]], "b_names": [[]]})
        return pd.concat([shown, rest], ignore_index=True)

    def kernel_table(self, display: bool = False) -> pd.DataFrame:
        movers = self.with_rest(self.movers())
        table = _deltas(movers.drop(columns=["a_names", "b_names"]))
        if display:
            table["kernel"] = table["kernel"].map(display_name)
            names = [_variants(a, b) for a, b in zip(movers["a_names"], movers["b_names"], strict=True)]
            if any(names):  # only where some kernel's names differ between the sides
                table["names"] = names
        return table

    def explained_pct(self) -> float:
        kernels = self.kernels()
        total = float((kernels["b_ns"] - kernels["a_ns"]).sum())
        shown = self.movers()
        part = float((shown["b_ns"] - shown["a_ns"]).sum())
        return 100.0 if total == 0 else 100.0 * part / total

    def tables(self, display: bool = False) -> list[tuple[str, pd.DataFrame]]:
        per = f" (median per {self.a.unit}: A {self.a.run_count}, B {self.b.run_count} runs)" \
            if max(self.a.run_count, self.b.run_count) > 1 else ""
        deltas = ("a_ms", "b_ms", "delta_ms", "speedup")
        tables = [(Title(f"Time by category: A vs B{per}", "categories", deltas), self.category_table())]
        phases = self.phases()
        if len(phases):
            tables.append((Title("Per phase: A vs B", "phases", deltas), self.phase_table()))
        tables.append((Title(f"Kernels that moved most (explain {self.explained_pct():.0f}% of the change; matched "
                             "by what they compute)", "top_kernels", deltas), self.kernel_table(display)))
        once = self.kernels().query("status != 'both'")
        if len(once):
            shown = _deltas(once.drop(columns=["a_names", "b_names"]).head(max(self.top, 1)))
            if display:
                shown["kernel"] = shown["kernel"].map(display_name)
            tables.append((Title("Kernels only one side has (new in B, vanished from B)", "one_side_only",
                                 ("status", *deltas)), shown))
        if self.fail_above_pct is not None or max(self.a.run_count, self.b.run_count) > 1:
            gate = self.gate()
            shown = pd.DataFrame({"check": gate["check"], "a_ms": gate["a_ns"] / NS_PER_MS,
                                  "a_range_ms": gate["a_range_ns"] / NS_PER_MS, "b_ms": gate["b_ns"] / NS_PER_MS,
                                  "b_range_ms": gate["b_range_ns"] / NS_PER_MS,
                                  "delta_ms": gate["delta_ns"] / NS_PER_MS, "change_pct": gate["change_pct"],
                                  "verdict": gate["verdict"]})
            if self.fail_above_pct is None:
                title = "Changes against the runs' noise"
            else:
                shown["regressed"] = gate["regressed"]
                title = (f"Regression gate: a change outside the runs' range, above {self.floor_ns / NS_PER_MS:.3f}"
                         f" ms and more than {self.fail_above_pct:g}% fails: {'FAIL' if self.failed else 'pass'}")
            tables.append((Title(title, "gate", ("delta_ms", "change_pct", "verdict", "regressed")), shown))
        return tables

    def to_json(self) -> dict[str, Any]:
        movers = self.movers()
        return {
            "a": {**self.a.to_json(), "path": self.a.origin},
            "b": {**self.b.to_json(), "path": self.b.origin},
            "categories": records(_deltas(self.categories(), keep_ns=True)),
            "phases": records(_deltas(self.phases(), keep_ns=True)),
            "top_kernels": records(_deltas(movers, keep_ns=True)),
            "kernels": records(_deltas(self.with_rest(self.kernels()), keep_ns=True)),
            "explained_pct": self.explained_pct(),
            "gate": None if self.fail_above_pct is None else {
                "fail_above_pct": self.fail_above_pct,
                "min_delta_ns": self.floor_ns,
                "gates": list(self.gates),
                "rule": "a change fails when B's median is above A's by more than both sides' range over their "
                        "runs, the floor and fail_above_pct",
                "verdict": "fail" if self.failed else "pass",
                "checks": records(self.gate()),
            },
        }

    @property
    def notes(self) -> list[str]:
        """The notes of both sides' reports, and which steps each compares where it left some out, each marked
        with its side."""
        notes = []
        for side in (self.a, self.b):
            for s in side.summaries:
                left_out = left_out_note(s.steps, "the comparison") if side.unit == STEP and s.steps is not None \
                    else None
                notes += [f"{side.label}: {note}" for note in [*s.notes, left_out] if note]
        return notes

    def caption(self) -> str:
        line = f"A = {self.a.origin}, B = {self.b.origin}; speedup = A / B"
        return "\n".join([line] + [f"note: {n}" for n in self.notes])


def _variants(a: list[str], b: list[str]) -> str:
    """The names behind a matched kernel when the sides differ, shortened: `A: x (+n) | B: y (+m)`."""
    if a == b:
        return ""

    def one(names: list[str]) -> str:
        more = f" (+{len(names) - 1})" if len(names) > 1 else ""
        return "–" if not names else display_name(names[0], DISPLAY_NAME_CHARS) + more

    return f"A: {one(a)} | B: {one(b)}"


def compare(a: KernelSummary | Side | list[KernelSummary], b: KernelSummary | list[KernelSummary],
            top: int = DEFAULT_TOP, fail_above_pct: float | None = None, gates: tuple[str, ...] = DEFAULT_GATES,
            min_delta_ns: int | None = None) -> Comparison:
    """A and B side by side, each a report, several runs, or (A) a saved side; with `fail_above_pct`, also the
    regression gate over `gates` (of GATES). A GPU report and a trace without kernels (CPU operator time)
    measure different things, and runs of steps do not compare with whole reports: ProfilerKitError."""
    sides = []
    for value, label in ((a, "A"), (b, "B")):
        summaries = value if isinstance(value, list) else [value]
        sides.append(value if isinstance(value, Side) else side_of(summaries, label))
    first, second = sides
    bases = {s.basis for s in (*first.summaries, *second.summaries)}
    if len(bases) > 1:
        raise ProfilerKitError("one side is timed by GPU kernels, the other by CPU operators: compare reports of "
                               "the same kind (GPU kernels with GPU kernels, a CPU trace with a CPU trace)")
    if first.unit != second.unit:
        raise ProfilerKitError(f"A's runs are {first.unit}s and B's are {second.unit}s: compare reports that both "
                               "have a per-step table, or both not")
    unknown = set(gates) - set(GATES)
    if unknown:
        raise ValueError(f"unknown gate(s) {', '.join(sorted(unknown))}; choose from {', '.join(GATES)}")
    return Comparison(first, second, top, fail_above_pct, tuple(gates), min_delta_ns)


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
