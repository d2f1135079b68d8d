"""The memory report of one snapshot: the tables `profiler-kit memory` prints, its JSON, and the notes that
qualify them (truncated trace, OOM, allocations without a Python frame, missing evidence)."""

from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from profiler_kit.defaults import MEMORY_TOP
from profiler_kit.memory.analyze import MIB, Reconstruction, reconstruct
from profiler_kit.memory.evidence import ZERO_GRAD, allocation_marks
from profiler_kit.memory.phases import (
    INFERRED_SOURCE,
    RECORDER_STEPS,
    Phases,
    PhaseSpan,
    phase_at,
    phase_peaks,
    place_phases,
    step_phase_peaks,
)
from profiler_kit.memory.roles import (
    GRADIENT,
    OPTIMIZER_STATE,
    PARAMETER,
    UNKNOWN,
    evidence_summary,
    infer_roles,
    roles_at,
    sizes_are_rounded,
)
from profiler_kit.memory.snapshot import load_metadata, load_snapshot
from profiler_kit.memory.tables import (
    DISPLAY_POSITION,
    expected_vs_measured,
    frame_with_optional_ints,
    top_allocations,
)
from profiler_kit.render import Title, records

DEFAULT_TOP = MEMORY_TOP


@dataclass
class MemoryReport:
    """Everything known about one snapshot; `expected` needs the recorder's metadata (sidecar or embedded)."""

    source: str
    recon: Reconstruction
    placed: Phases
    roles: pd.Series
    evidence: pd.Series
    summary: pd.DataFrame
    phases: pd.DataFrame | None
    step_peaks: pd.DataFrame | None
    roles_at_peak: pd.DataFrame
    top: pd.DataFrame
    expected: pd.DataFrame | None
    notes: list[str]
    meta: dict | None
    meta_source: str | None = None

    @property
    def spans(self) -> list[PhaseSpan]:
        return self.placed.spans

    @property
    def rank(self) -> int | None:
        """The process's RANK under torchrun, as the recorder wrote it."""
        return (self.meta or {}).get("rank")

    def title(self) -> str:
        """`xl ctx 256 train bf16, batch 4, <GPU>` from the recorder's metadata, else the snapshot's file name;
        `, rank R of W` for a process of a distributed job."""
        meta = self.meta or {}
        of = f", rank {meta['rank']} of {meta['world_size']}" if meta.get("rank") is not None and \
            meta.get("world_size") else ""
        if not meta.get("config"):
            return (Path(self.source).name or "memory snapshot") + of
        cfg = meta["config"]
        precision = " bf16" if cfg["mixed_precision"] else ""
        gpu = f", {meta['device_name']}" if meta.get("device_name") else ""
        return f"{cfg['model']} ctx {cfg['ctx']} {cfg['mode']}{precision}, batch {cfg['batch_size']}{gpu}{of}"

    def caption(self) -> str:
        lines = [f"{self.source}: device {self.recon.device}, {self.recon.n_entries:,} trace entries; "
                 "MiB = 2^20 bytes"]
        return "\n".join(lines + [f"note: {n}" for n in self.notes])

    def tables(self, display: bool = False) -> list[tuple[str, pd.DataFrame]]:
        """The report's tables; for people (`display`) the largest allocations' ordinal is `#`. Narrowed to a
        terminal, the evidence is cut at a word (JSON and HTML hold it whole)."""
        out = [("peak memory", self.summary)]
        if self.step_peaks is not None:
            out.append(("peak allocated per step and phase", self.step_peaks))
        if self.phases is not None:
            out.append(("peaks per phase", self.phases.drop(columns=["peak_allocated_bytes"])))
        out.append((Title("allocated at the peak by role", key=("size_mib", "share_pct", "evidence"),
                          prose=("evidence",)), self.roles_at_peak.drop(columns=["size_bytes"])))
        top = self.top.rename(columns={"position": DISPLAY_POSITION}) if display else self.top
        out.append((Title(f"largest {len(self.top)} allocations alive at the peak",
                          key=("size_mib", "role", "evidence"), prose=("evidence",)), top))
        if self.expected is not None:
            out.append(("expected vs measured tensor sizes", self.expected))
        return out

    def to_json(self) -> dict:
        recon = self.recon
        peak = recon.peak_index
        phases = None
        if self.phases is not None:
            phases = [{"name": row.pop("phase"), **row} for row in records(self.phases)]
        step = next((s.step for s in self.spans if s.start <= peak < s.end), None)
        if step is None:
            step = next((s.step for s in self.placed.steps if s.start <= peak < s.end), None)
        return {
            "snapshot": self.source,
            "rank": self.rank,
            "world_size": (self.meta or {}).get("world_size"),
            "device": recon.device,
            "trace_entries": recon.n_entries,
            "metadata_source": self.meta_source,
            "peak": {
                "allocated_bytes": recon.peak_allocated_bytes,
                "reserved_bytes": recon.peak_reserved_bytes,
                "event": peak,
                "phase": phase_at(self.placed, peak),
                "step": step,
                "time_us": None if recon.time_us is None or peak < 0 else int(recon.time_us[peak]),
            },
            "config": (self.meta or {}).get("config"),
            "allocator_peak": None if self.meta is None else {
                "allocated_bytes": self.meta.get("peak_allocated_bytes"),
                "reserved_bytes": self.meta.get("peak_reserved_bytes"),
            },
            "oom": (self.meta or {}).get("oom"),
            "oom_events": recon.oom_events,
            "phases": phases,
            "steps_from": self.placed.steps_from,
            "peaks_by_step": None if self.step_peaks is None else records(self.step_peaks),
            "roles_at_peak": records(self.roles_at_peak),
            "top_allocations": records(self.top),
            "expected_vs_measured": None if self.expected is None else records(self.expected),
            "notes": self.notes,
        }


def _summary_table(recon: Reconstruction, placed: Phases, meta: dict | None) -> pd.DataFrame:
    spans = placed.spans
    rows = [{
        "source": "trace (requested bytes)",
        "peak_allocated_mib": recon.peak_allocated_bytes / MIB,
        "peak_phase": phase_at(placed, recon.peak_index),
        "peak_reserved_mib": recon.peak_reserved_bytes / MIB,
        "peak_event": recon.peak_index,
    }]
    if meta is not None and meta.get("peak_allocated_bytes") is not None:
        counted = [s for s in spans if s.counter_peak_bytes is not None]
        top = max(counted, key=lambda s: s.counter_peak_bytes).label if counted else None
        rows.append({
            "source": "allocator counters (rounded blocks)",
            "peak_allocated_mib": meta["peak_allocated_bytes"] / MIB,
            "peak_phase": top,
            "peak_reserved_mib": meta["peak_reserved_bytes"] / MIB,
            "peak_event": None,
        })
    return frame_with_optional_ints(rows, list(rows[0]), ("peak_event",))


def _notes(recon: Reconstruction, placed: Phases, top: pd.DataFrame, roles: pd.DataFrame,
           meta: dict | None, freed: list[frozenset[str]]) -> list[str]:
    spans = placed.spans
    notes = []
    if recon.n_entries == 0:
        notes.append("the snapshot has no trace (memory history was off): the peak is its state when taken")
    if meta is not None:
        max_entries = meta.get("max_entries")
        if max_entries and recon.n_entries >= max_entries:
            notes.append(f"the trace filled max_entries={max_entries}: its oldest events were dropped, so "
                         "allocations made before them count as alive from the start; record again with a "
                         "larger --max-entries")
        if meta.get("phases") and recon.time_us is None:
            notes.append("the trace entries carry no time_us, so phases cannot be placed on the trace")
        notes.extend(f"the recorder's list of storages {c['label']}: {c['note']}"
                     for c in meta.get("storages") or [] if isinstance(c, dict) and c.get("note"))
        oom = meta.get("oom")
        if oom:
            notes.append(f"the recorded step ran out of memory in {oom['phase']} (step {oom['step']}): "
                         f"{oom['summary']}")
        if meta.get("program_oom"):
            notes.append(f"the program ran out of memory ({meta['program_oom']}); the snapshot is its memory then")
    if placed.steps_from and placed.steps_from != RECORDER_STEPS:
        notes.append(f"steps: {placed.steps_from}, counted from the first in the snapshot")
    if meta is None and not spans and recon.n_entries:
        notes.append("no phases: the snapshot has no recorder metadata and no record_function ranges "
                     "(wrap the steps in profiler_kit.phase(name) or torch.profiler.record_function)")
    for event in recon.oom_events:
        requested = (event["requested_bytes"] or 0) / MIB
        free = (event["device_free_bytes"] or 0) / MIB
        notes.append(f"trace entry {event['event']} is an OOM: {requested:,.1f} MiB requested, "
                     f"{free:,.1f} MiB free on the device")
    if top["where"].isna().any():
        notes.append("'where' is empty for allocations made with no Python frame outside torch on the stack, "
                     "e.g. by the autograd engine's thread in backward, or before the trace began")
    if any(s.source == INFERRED_SOURCE for s in spans):
        notes.append("phases with source 'inferred' are not named in the snapshot: a backward runs from the first "
                     "to the last allocation or free of the autograd engine (or of code it runs, such as activation "
                     "checkpointing's recomputation), a forward from the first allocation by Python code before it")
    alive = recon.alive_at(recon.peak_index)
    notes.extend(_absent_at_peak(recon, placed, roles, alive, freed))
    unknown = roles.loc[alive.index, "role"] == UNKNOWN
    unknown_bytes = int(alive.loc[unknown, "size_bytes"].sum())
    if unknown_bytes:
        share = 100 * unknown_bytes / recon.peak_allocated_bytes
        reasons = evidence_summary(alive.loc[unknown, "size_bytes"], roles.loc[alive.index[unknown], "evidence"])
        notes.append(f"{share:.0f}% of the bytes at the peak have role 'unknown': {reasons}")
    return notes


def _absent_at_peak(recon: Reconstruction, placed: Phases, roles: pd.DataFrame, alive: pd.DataFrame,
                    freed: list[frozenset[str]]) -> list[str]:
    """Why the parameters, gradients or optimizer state that the trace holds are not alive at the peak: when (and,
    for `zero_grad`, by what) the last one before it was freed, and when the next one after it was made
    (`freed`: each allocation's marks of the stack that freed it)."""
    notes = []
    peak, a = recon.peak_index, recon.allocations
    for role in (PARAMETER, GRADIENT, OPTIMIZER_STATE):
        mine = roles["role"] == role
        if not mine.any() or (roles.loc[alive.index, "role"] == role).any():
            continue
        before, after = a.loc[mine & (a["end"] <= peak), "end"], a.loc[mine & (a["start"] > peak), "start"]
        by = ", by zero_grad" if len(before) and ZERO_GRAD in freed[a.index.get_loc(before.idxmax())] else ""
        why = [f"the last one before it was freed at event {before.max()} ({phase_at(placed, int(before.max()))}"
               f"{by})" if len(before) else "",
               f"the next one is made at event {after.min()} ({phase_at(placed, int(after.min()))})"
               if len(after) else ""]
        notes.append(f"no {role} is alive at the peak (event {peak}): " + "; ".join(w for w in why if w))
    return notes


def analyze(snapshot: dict, meta: dict | None = None, top: int = DEFAULT_TOP, device: int | None = None,
            source: str = "", meta_source: str | None = None) -> MemoryReport:
    """Analyse an in-memory snapshot (with the recorder's metadata, when it wrote some)."""
    recon = reconstruct(snapshot, device)
    marks = allocation_marks(recon.allocations)
    placed = place_phases(recon, snapshot, meta, marks)
    roles = infer_roles(recon, placed.spans, meta, sizes_are_rounded(snapshot), marks)
    top_df = top_allocations(recon, roles, placed, top)
    by_role = roles_at(recon, roles["role"], recon.peak_index, roles["evidence"])
    config = (meta or {}).get("config")
    return MemoryReport(
        source=source,
        recon=recon,
        placed=placed,
        roles=roles["role"],
        evidence=roles["evidence"],
        summary=_summary_table(recon, placed, meta),
        phases=phase_peaks(recon, placed.spans),
        step_peaks=step_phase_peaks(recon, placed),
        roles_at_peak=by_role,
        top=top_df,
        expected=expected_vs_measured(recon, roles["role"], config) if config else None,
        notes=_notes(recon, placed, top_df, roles, meta, marks[1]),
        meta=meta,
        meta_source=meta_source,
    )


def analyze_file(path: str | Path, top: int = DEFAULT_TOP, device: int | None = None,
                 use_sidecar: bool = True) -> MemoryReport:
    """Load a snapshot pickle and analyse it with the recorder's metadata: `<stem>.json` beside it (unless
    `use_sidecar` is off, or it is not the recorder's: then a note says so), else what the recorder stored inside
    the snapshot."""
    # A snapshot is millions of small dicts and lists that form no cycles: the cyclic collector, which would walk
    # them again and again while they are built and read, is paused meanwhile (4x faster on a long trace).
    collecting = gc.isenabled()
    gc.disable()
    try:
        snapshot = load_snapshot(path)
        meta, meta_source, note = load_metadata(path, snapshot, use_sidecar)
        report = analyze(snapshot, meta, top, device, source=str(path), meta_source=meta_source)
    finally:
        if collecting:
            gc.enable()
    if note:
        report.notes.insert(0, note)
    return report
