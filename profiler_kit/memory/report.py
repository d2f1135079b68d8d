"""The memory report of one snapshot: the tables `profiler-kit memory` prints, its JSON, and the notes that
qualify them (truncated trace, OOM, allocations without a Python frame)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from profiler_kit.memory.analyze import (
    MIB,
    PhaseSpan,
    Reconstruction,
    assign_roles,
    expected_vs_measured,
    frame_with_optional_ints,
    phase_at,
    phase_spans,
    reconstruct,
    top_allocations,
)
from profiler_kit.memory.snapshot import load_sidecar, load_snapshot, sidecar_path
from profiler_kit.render import records

DEFAULT_TOP = 10
PHASE_COLUMNS = [
    "step", "phase", "peak_allocated_mib", "peak_reserved_mib", "allocated_at_end_mib", "completed",
]


@dataclass
class MemoryReport:
    """Everything known about one snapshot; `phases` and `expected` need the recorder's sidecar."""

    source: str
    recon: Reconstruction
    spans: list[PhaseSpan]
    summary: pd.DataFrame
    phases: pd.DataFrame | None
    top: pd.DataFrame
    expected: pd.DataFrame | None
    notes: list[str]
    sidecar: dict | None

    def title(self) -> str:
        """`xl ctx 256 train bf16, batch 4, <GPU>` from the sidecar, else the snapshot's file name."""
        if not self.sidecar or not self.sidecar.get("config"):
            return Path(self.source).name or "memory snapshot"
        cfg = self.sidecar["config"]
        precision = " bf16" if cfg["mixed_precision"] else ""
        gpu = f", {self.sidecar['device_name']}" if self.sidecar.get("device_name") else ""
        return f"{cfg['model']} ctx {cfg['ctx']} {cfg['mode']}{precision}, batch {cfg['batch_size']}{gpu}"

    def tables(self) -> list[tuple[str, pd.DataFrame]]:
        out = [("peak memory", self.summary)]
        if self.phases is not None:
            out.append(("peaks per phase (allocator counters)", self.phases))
        out.append((f"largest {len(self.top)} allocations alive at the peak", self.top))
        if self.expected is not None:
            out.append(("expected vs measured tensor sizes", self.expected))
        return out

    def as_json(self) -> dict:
        recon = self.recon
        peak = recon.peak_index
        return {
            "snapshot": self.source,
            "device": recon.device,
            "trace_entries": recon.n_entries,
            "peak": {
                "allocated_bytes": recon.peak_allocated_bytes,
                "reserved_bytes": recon.peak_reserved_bytes,
                "event": peak,
                "phase": phase_at(self.spans, peak),
                "time_us": None if recon.time_us is None or peak < 0 else int(recon.time_us[peak]),
            },
            "config": (self.sidecar or {}).get("config"),
            "allocator_peak": None if self.sidecar is None else {
                "allocated_bytes": self.sidecar.get("peak_allocated_bytes"),
                "reserved_bytes": self.sidecar.get("peak_reserved_bytes"),
            },
            "oom": (self.sidecar or {}).get("oom"),
            "oom_events": recon.oom_events,
            "phases": None if self.phases is None else records(self.phases),
            "top_allocations": records(self.top),
            "expected_vs_measured": None if self.expected is None else records(self.expected),
            "notes": self.notes,
        }


def _phases_table(sidecar: dict) -> pd.DataFrame | None:
    phases = sidecar.get("phases") or []
    if not phases:
        return None
    rows = [{
        "step": p["step"] + 1,
        "phase": p["phase"],
        "peak_allocated_mib": p["peak_allocated_bytes"] / MIB,
        "peak_reserved_mib": p["peak_reserved_bytes"] / MIB,
        "allocated_at_end_mib": p["allocated_bytes"] / MIB,
        "completed": p.get("completed", True),
    } for p in phases]
    return pd.DataFrame(rows, columns=PHASE_COLUMNS)


def _summary_table(recon: Reconstruction, spans: list[PhaseSpan], phases: pd.DataFrame | None,
                   sidecar: dict | None) -> pd.DataFrame:
    rows = [{
        "source": "trace (requested bytes)",
        "peak_allocated_mib": recon.peak_allocated_bytes / MIB,
        "peak_reserved_mib": recon.peak_reserved_bytes / MIB,
        "peak_event": recon.peak_index,
        "peak_phase": phase_at(spans, recon.peak_index),
    }]
    if sidecar is not None and sidecar.get("peak_allocated_bytes") is not None:
        top_phase = None
        if phases is not None:
            best = phases.loc[phases["peak_allocated_mib"].idxmax()]
            several = phases["step"].nunique() > 1
            top_phase = f"{best['phase']} (step {best['step']})" if several else best["phase"]
        rows.append({
            "source": "allocator counters (rounded blocks)",
            "peak_allocated_mib": sidecar["peak_allocated_bytes"] / MIB,
            "peak_reserved_mib": sidecar["peak_reserved_bytes"] / MIB,
            "peak_event": None,
            "peak_phase": top_phase,
        })
    return frame_with_optional_ints(rows, list(rows[0]), ("peak_event",))


def _notes(recon: Reconstruction, spans: list[PhaseSpan], top: pd.DataFrame,
           sidecar: dict | None) -> list[str]:
    notes = []
    if recon.n_entries == 0:
        notes.append("the snapshot has no trace (memory history was off): the peak is its state when taken")
    if sidecar is not None:
        max_entries = sidecar.get("max_entries")
        if max_entries and recon.n_entries >= max_entries:
            notes.append(f"the trace filled max_entries={max_entries}: its oldest events were dropped, so "
                         "allocations made before them count as alive from the start; record again with a "
                         "larger --max-entries")
        if sidecar.get("phases") and not spans:
            notes.append("the trace entries carry no time_us, so phases cannot be placed on the trace")
        oom = sidecar.get("oom")
        if oom:
            notes.append(f"the recorded step ran out of memory in {oom['phase']} (step {oom['step'] + 1}): "
                         f"{oom['summary']}")
    for event in recon.oom_events:
        requested = (event["requested_bytes"] or 0) / MIB
        free = (event["device_free_bytes"] or 0) / MIB
        notes.append(f"trace entry {event['event']} is an OOM: {requested:,.1f} MiB requested, "
                     f"{free:,.1f} MiB free on the device")
    if top["where"].isna().any():
        notes.append("'where' is empty for allocations made with no Python frame outside torch on the stack, "
                     "e.g. by the autograd engine's thread in backward, or before the trace began")
    return notes


def analyze(snapshot: dict, sidecar: dict | None = None, top: int = DEFAULT_TOP, device: int | None = None,
            source: str = "") -> MemoryReport:
    """Analyse an in-memory snapshot (and its sidecar, when the recorder wrote one)."""
    recon = reconstruct(snapshot, device)
    spans = phase_spans(recon, sidecar)
    roles = assign_roles(recon, sidecar)
    phases = _phases_table(sidecar) if sidecar else None
    top_df = top_allocations(recon, roles, spans, top)
    config = (sidecar or {}).get("config")
    expected = expected_vs_measured(recon, roles, config) if config else None
    return MemoryReport(
        source=source,
        recon=recon,
        spans=spans,
        summary=_summary_table(recon, spans, phases, sidecar),
        phases=phases,
        top=top_df,
        expected=expected,
        notes=_notes(recon, spans, top_df, sidecar),
        sidecar=sidecar,
    )


def analyze_file(path: str | Path, top: int = DEFAULT_TOP, device: int | None = None) -> MemoryReport:
    """Load a snapshot pickle (and `<stem>.json` beside it when present) and analyse it."""
    snapshot = load_snapshot(path)
    sidecar = load_sidecar(path)
    report = analyze(snapshot, sidecar, top, device, source=str(path))
    if sidecar is None:
        report.notes.append(f"no sidecar {sidecar_path(path).name}: no per-phase peaks or expected sizes")
    return report
