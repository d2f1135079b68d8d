"""The snapshots of a distributed job's ranks side by side: each rank's peak, the phase it falls in and the bytes of
each role at it; which rank peaks highest, by how much over the lowest, and by which roles.

`profiler-kit memory -- torchrun …` writes `<stem>.rank<R>.pickle` per rank; `memory summarize` takes those
files, or the stem, or a glob, and merges them here. Each snapshot is analysed on its own and only its peak and
roles are kept, so several ranks cost no more memory than the largest one.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from profiler_kit.errors import ProfilerKitError
from profiler_kit.memory.analyze import MIB
from profiler_kit.memory.report import DEFAULT_TOP, MemoryReport, analyze_file
from profiler_kit.memory.roles import ROLES
from profiler_kit.render import records

RANK_FILE = re.compile(r"\.rank(\d+)\.pickle$")
_GLOB = re.compile(r"[*?\[]")


@dataclass(frozen=True)
class RankPeak:
    """What the merged view keeps of one rank's report: its peak, the phase of it, and its roles there
    (`MemoryReport.roles_at_peak`)."""

    rank: int
    source: str
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    peak_phase: str | None
    roles: pd.DataFrame
    world_size: int | None


def rank_peak(report: MemoryReport, position: int) -> RankPeak:
    """One rank's peak: its rank from the recorder's metadata, else from the file name (`.rank<R>.pickle`), else
    its position among the snapshots given."""
    rank = report.rank
    if rank is None:
        match = RANK_FILE.search(report.source)
        rank = int(match.group(1)) if match else position
    return RankPeak(rank, report.source, report.recon.peak_allocated_bytes, report.recon.peak_reserved_bytes,
                    report.summary.loc[0, "peak_phase"], report.roles_at_peak, (report.meta or {}).get("world_size"))


def snapshot_paths(args: Iterable[str | Path]) -> list[Path]:
    """The snapshots named by `args`: each a file, a glob (quoted, so the shell left it), or a stem that per-rank
    files `<stem>.rank<R>.pickle` share; per-rank files in rank order."""
    paths: list[Path] = []
    for arg in map(str, args):
        if Path(arg).exists() or Path(arg).is_symlink():
            paths.append(Path(arg))
            continue
        found = glob.glob(arg) if _GLOB.search(arg) else glob.glob(glob.escape(arg) + ".rank*.pickle")
        found = [f for f in found if not _GLOB.search(arg) or Path(f).is_file()]
        if not found:
            raise ProfilerKitError(f"no such snapshot file: {arg}" + ("" if _GLOB.search(arg) else
                                   f" (nor per-rank files {arg}.rank<R>.pickle)"))
        paths += sorted(map(Path, found), key=_rank_order)
    return paths


def _rank_order(path: Path) -> tuple[int, str]:
    match = RANK_FILE.search(path.name)
    return (int(match.group(1)) if match else -1, str(path))


def _role_column(role: str) -> str:
    return f"{role.replace(' ', '_')}_mib"


@dataclass
class MergedReport:
    """The ranks' peaks (`per_rank`), and the roles at the highest rank's peak against the lowest rank's
    (`highest`)."""

    ranks: list[RankPeak]
    per_rank: pd.DataFrame
    highest: pd.DataFrame
    notes: list[str]

    def caption(self) -> str:
        high, low = self._extremes()
        lines = [f"{len(self.ranks)} ranks: " + ", ".join(r.source for r in self.ranks) + f"; the highest peak is "
                 f"rank {high.rank}'s, the lowest rank {low.rank}'s; MiB = 2^20 bytes"]
        return "\n".join(lines + [f"note: {n}" for n in self.notes])

    def tables(self, display: bool = False) -> list[tuple[str, pd.DataFrame]]:
        """The merged view's tables; the same for every format (`display` is the render layer's protocol)."""
        return [("peak per rank", self.per_rank),
                ("allocated at the highest rank's peak by role, against the lowest rank's", self.highest)]

    def _extremes(self) -> tuple[RankPeak, RankPeak]:
        return (max(self.ranks, key=lambda r: r.peak_allocated_bytes),
                min(self.ranks, key=lambda r: r.peak_allocated_bytes))

    def to_json(self) -> dict:
        high, low = self._extremes()
        return {"ranks": records(self.per_rank), "highest_rank": high.rank, "lowest_rank": low.rank,
                "highest_by_role": records(self.highest), "notes": self.notes}


def merge(ranks: list[RankPeak]) -> MergedReport:
    """The merged view of several ranks' peaks (see the module docstring)."""
    if len({r.rank for r in ranks}) < len(ranks):  # e.g. snapshots of several single-process runs
        ranks = [replace(r, rank=i) for i, r in enumerate(ranks)]
        notes = ["several snapshots name the same rank: they are numbered in the order given"]
    else:
        notes = []
    ranks = sorted(ranks, key=lambda r: r.rank)
    lowest = min(r.peak_allocated_bytes for r in ranks)
    sizes = {r.rank: dict(zip(r.roles["role"], r.roles["size_bytes"], strict=True)) for r in ranks}
    present = [role for role in ROLES if any(sizes[r.rank].get(role) for r in ranks)]
    per_rank = pd.DataFrame([{
        "rank": r.rank,
        "peak_allocated_mib": r.peak_allocated_bytes / MIB,
        "above_lowest_mib": (r.peak_allocated_bytes - lowest) / MIB,
        "peak_reserved_mib": r.peak_reserved_bytes / MIB,
        "peak_phase": r.peak_phase,
        **{_role_column(role): sizes[r.rank].get(role, 0) / MIB for role in present},
    } for r in ranks])
    high = max(ranks, key=lambda r: r.peak_allocated_bytes)
    low = min(ranks, key=lambda r: r.peak_allocated_bytes)
    highest = _by_role(high, low, present)
    return MergedReport(ranks, per_rank, highest, notes + _notes(ranks, high, low, highest))


def _by_role(high: RankPeak, low: RankPeak, roles: list[str]) -> pd.DataFrame:
    """Per role: bytes at the highest rank's peak, their share of its allocated bytes there, and the lowest
    rank's bytes at its own peak beside them."""
    hi = dict(zip(high.roles["role"], high.roles["size_bytes"], strict=True))
    lo = dict(zip(low.roles["role"], low.roles["size_bytes"], strict=True))
    total = sum(hi.values())
    return pd.DataFrame([{
        "role": role,
        "size_mib": hi.get(role, 0) / MIB,
        "share_pct": 100.0 * hi.get(role, 0) / total if total else 0.0,
        "lowest_rank_mib": lo.get(role, 0) / MIB,
        "delta_mib": (hi.get(role, 0) - lo.get(role, 0)) / MIB,
    } for role in roles], columns=["role", "size_mib", "share_pct", "lowest_rank_mib", "delta_mib"])


def _percent(part: int, whole: int) -> str:
    return f" ({100.0 * part / whole:.1f}%)" if whole else ""


def _notes(ranks: list[RankPeak], high: RankPeak, low: RankPeak, highest: pd.DataFrame) -> list[str]:
    notes = []
    gap = high.peak_allocated_bytes - low.peak_allocated_bytes
    where = f" in {high.peak_phase}" if high.peak_phase else ""
    if gap == 0:
        notes.append(f"every rank peaks at {high.peak_allocated_bytes / MIB:,.1f} MiB allocated")
    else:
        grew = highest[highest["delta_mib"] > 0].sort_values("delta_mib", ascending=False, kind="stable")
        by = "; most of it " + ", ".join(f"{row.role} (+{row.delta_mib:,.1f} MiB)" for row in
                                         grew.head(2).itertuples()) if len(grew) else ""
        notes.append(f"rank {high.rank} peaks highest: {high.peak_allocated_bytes / MIB:,.1f} MiB allocated{where}, "
                     f"{gap / MIB:,.1f} MiB{_percent(gap, low.peak_allocated_bytes)} above rank {low.rank}, the "
                     f"lowest{by}")
    sizes = {r.world_size for r in ranks if r.world_size}
    if len(sizes) == 1 and (world := sizes.pop()) != len(ranks):
        notes.append(f"the job had {world} ranks; {len(ranks)} snapshots are merged")
    return notes


def summarize_ranks(paths: list[Path], device: int | None = None, use_sidecar: bool = True) -> MergedReport:
    """Analyse each rank's snapshot in turn, keeping only its peak and roles, and merge them."""
    return merge([rank_peak(analyze_file(path, DEFAULT_TOP, device, use_sidecar), i)
                  for i, path in enumerate(paths)])
