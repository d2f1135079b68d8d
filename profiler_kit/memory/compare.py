"""Two memory reports side by side (fp32 vs bf16, before vs after a change): peaks, per-phase peaks and bytes per
role at the peak, each with B − A and its percentage of A."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from profiler_kit.memory.analyze import MIB
from profiler_kit.memory.report import MemoryReport
from profiler_kit.memory.roles import ROLES
from profiler_kit.render import records

COMPARE_COLUMNS = ["a_mib", "b_mib", "delta_mib", "delta_pct"]


@dataclass
class MemoryComparison:
    a: MemoryReport
    b: MemoryReport
    peaks: pd.DataFrame
    phases: pd.DataFrame | None
    roles: pd.DataFrame

    @property
    def notes(self) -> list[str]:
        return [f"A: {n}" for n in self.a.notes] + [f"B: {n}" for n in self.b.notes]

    def caption(self) -> str:
        lines = [f"A = {self.a.source} ({self.a.title()}), B = {self.b.source} ({self.b.title()}); "
                 "MiB = 2^20 bytes"]
        return "\n".join(lines + [f"note: {n}" for n in self.notes])

    def tables(self, display: bool = False) -> list[tuple[str, pd.DataFrame]]:
        """The comparison's tables; the same for every format (`display` is part of the render layer's protocol)."""
        out = [("peaks", self.peaks)]
        if self.phases is not None:
            out.append(("peak allocated per phase", self.phases))
        out.append(("allocated at the peak by role", self.roles))
        return out

    def to_json(self) -> dict:
        return {
            "a": {"snapshot": self.a.source, "title": self.a.title()},
            "b": {"snapshot": self.b.source, "title": self.b.title()},
            "peaks": records(self.peaks),
            "phases": None if self.phases is None else records(self.phases),
            "roles_at_peak": records(self.roles),
        }


def _row(key: str, name: str, a_bytes: int | None, b_bytes: int | None) -> dict:
    """One compared quantity; a side without it (a phase only one snapshot has) is NaN, null in JSON."""
    nan = float("nan")
    a_mib = nan if a_bytes is None else a_bytes / MIB
    b_mib = nan if b_bytes is None else b_bytes / MIB
    delta = nan if a_bytes is None or b_bytes is None else (b_bytes - a_bytes) / MIB
    pct = 100.0 * (b_bytes - a_bytes) / a_bytes if a_bytes and b_bytes is not None else nan
    return {key: name, "a_mib": a_mib, "b_mib": b_mib, "delta_mib": delta, "delta_pct": pct}


def _frame(rows: list[dict], key: str) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=[key, *COMPARE_COLUMNS])


def _phase_bytes(report: MemoryReport) -> dict[str, int]:
    if report.phases is None:
        return {}
    return dict(zip(report.phases["phase"], report.phases["peak_allocated_bytes"], strict=True))


def compare(a: MemoryReport, b: MemoryReport) -> MemoryComparison:
    """Peak allocated/reserved, per-phase peaks (matched by phase name, in A's order then B's extra ones) and
    bytes per role at each one's peak."""
    peaks = _frame([
        _row("metric", "peak allocated", a.recon.peak_allocated_bytes, b.recon.peak_allocated_bytes),
        _row("metric", "peak reserved", a.recon.peak_reserved_bytes, b.recon.peak_reserved_bytes),
    ], "metric")
    pa, pb = _phase_bytes(a), _phase_bytes(b)
    names = list(pa) + [n for n in pb if n not in pa]
    phases = _frame([_row("phase", n, pa.get(n), pb.get(n)) for n in names], "phase") if names else None
    ra = dict(zip(a.roles_at_peak["role"], a.roles_at_peak["size_bytes"], strict=True))
    rb = dict(zip(b.roles_at_peak["role"], b.roles_at_peak["size_bytes"], strict=True))
    roles = _frame([_row("role", r, ra[r], rb[r]) for r in ROLES if ra[r] or rb[r]], "role")
    return MemoryComparison(a, b, peaks, phases, roles)
