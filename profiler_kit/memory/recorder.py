"""Record the CUDA caching allocator's history around the workload's steps and dump it for analysis.

Warm-up steps run before recording (they allocate AdamW state and settle the allocator's cache, which is not
what a step costs). Then history is switched on, the steps run while the workload's `on_phase_end` callback
reads and resets the allocator's peak counters at every phase boundary, and the snapshot is written with
pickle protocol 4, which pytorch.org/memory_viz reads. An out-of-memory error inside a recorded step is the
moment a snapshot matters most: it is caught, the snapshot is dumped anyway and the sidecar says where it hit.

The snapshot describes itself: each phase is a `record_function` range (so it lands in the snapshot's
`external_annotations`, and memory_viz shows it), allocations carry the phase as user metadata where torch can
attach it, and the sidecar's content (config, per-phase counter peaks, the storages of parameters, gradients and
optimizer moments, the Linear weights' sizes) is also stored in the snapshot dict under `profiler_kit`, so the
pickle alone analyses the same as pickle + sidecar.

Stacks are Python frames only (`stacks="python"`): they name the model code that allocated, which is what the
analysis reports. C++ frames (`"all"`) make every event slower to record, the dump slow to symbolise and the
file several times larger, for frames inside torch that the analysis skips anyway.
"""

from __future__ import annotations

import datetime
import inspect
import json
import os
import pickle
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from profiler_kit.errors import ProfilerKitError
from profiler_kit.memory.snapshot import EMBEDDED_KEY, SIDECAR_FORMAT, SIDECAR_VERSION, sidecar_path
from profiler_kit.memory.storages import STORAGES_KEY, capture_storages, trace_clock_us
from profiler_kit.names import DEFAULT_MAX_ENTRIES, DEFAULT_OUTPUT_DIR
from profiler_kit.workload import Workload, WorkloadConfig, release, synchronize

SNAPSHOT_PICKLE_PROTOCOL = 4  # what memory_viz reads; pinned because Python 3.14 defaults to protocol 5
STACKS = "python"
NO_CUDA_MESSAGE = (
    "memory snapshots need a CUDA device, and torch sees none here; "
    "`profiler-kit memory summarize FILE.pickle` reads existing snapshots anywhere"
)


@dataclass(frozen=True)
class RecordResult:
    snapshot_path: Path
    sidecar_path: Path
    sidecar: dict

    @property
    def oom(self) -> dict | None:
        """{"step", "phase", "summary", "message"} when a recorded step ran out of memory."""
        return self.sidecar["oom"]


def require_cuda(cfg: WorkloadConfig) -> None:
    if cfg.device == "cpu" or not torch.cuda.is_available():
        raise ProfilerKitError(NO_CUDA_MESSAGE)


def oom_summary(exc: BaseException) -> str:
    """The useful head of torch's multi-sentence OOM message: how much it tried to allocate."""
    text = " ".join(str(exc).split())
    match = re.search(r"Tried to allocate [\d.,]+ \w+", text)
    return match.group(0) if match else text[:160]


def _tag_allocations(text: str) -> None:
    """Attach `text` to the allocations made from now on (their `user_metadata`), where this torch can."""
    if hasattr(torch._C, "_cuda_setMemoryMetadata"):
        torch.cuda.memory._set_memory_metadata(text)


class _PhaseMeter:
    """The `on_phase_end` callback: per-phase peaks from the allocator's counters, reset at every boundary; each
    phase also runs inside a `record_function` range of its name, which the snapshot keeps as annotations."""

    def __init__(self, device: torch.device, phases: tuple[str, ...]) -> None:
        self.device = device
        self.phases = phases
        self.rows: list[dict] = []
        self.step = 0
        self._range: torch.profiler.record_function | None = None

    def _open(self, phase: str) -> None:
        self._range = torch.profiler.record_function(phase)
        self._range.__enter__()
        _tag_allocations(phase)

    def close(self) -> None:
        """End the open phase range, if any (after the last phase, or when a step fails)."""
        if self._range is not None:
            self._range.__exit__(None, None, None)
            self._range = None
            _tag_allocations("")

    def start_step(self, step: int) -> None:
        self.step = step
        torch.cuda.reset_peak_memory_stats(self.device)
        self._open(self.phases[0])

    def __call__(self, phase: str, completed: bool = True) -> None:
        self.close()
        self.rows.append({
            "step": self.step,
            "phase": phase,
            "peak_allocated_bytes": torch.cuda.max_memory_allocated(self.device),
            "peak_reserved_bytes": torch.cuda.max_memory_reserved(self.device),
            "allocated_bytes": torch.cuda.memory_allocated(self.device),
            # On the trace's clock, so the analysis can place phases on it.
            "end_time_us": trace_clock_us(),
            "completed": completed,
        })
        torch.cuda.reset_peak_memory_stats(self.device)
        following = self.phases.index(phase) + 1 if phase in self.phases else len(self.phases)
        if completed and following < len(self.phases):
            self._open(self.phases[following])

    def failed_phase(self) -> str:
        """The phase after the last one this step completed."""
        done = [r["phase"] for r in self.rows if r["step"] == self.step]
        return self.phases[len(done)] if len(done) < len(self.phases) else self.phases[-1]


def start_history(max_entries: int) -> None:
    kwargs = {"context": "all", "stacks": STACKS, "max_entries": max_entries}
    # Without clearing, a second recording in the same process keeps the first one's events; without global
    # annotations, only ranges opened on this thread are kept. Older torch releases lack one or both flags.
    accepted = inspect.signature(torch.cuda.memory._record_memory_history_impl).parameters
    for flag in ("clear_history", "global_record_annotations"):
        if flag in accepted:
            kwargs[flag] = True
    torch.cuda.memory._record_memory_history(enabled="all", **kwargs)


def storages_at_snapshot(workload: Workload) -> list[dict]:
    """The recorder's list of storages (`storages.py`): the parameters, their gradients and the optimizer's state
    as they are when the snapshot is taken."""
    optimizers = [workload.optimizer] if workload.optimizer is not None else []
    return [capture_storages(workload.model.parameters(), optimizers, label="the snapshot")]


def linear_weight_numels(workload: Workload) -> list[int]:
    """Element counts of the Linear weights: autocast casts these to bf16 copies in a mixed-precision forward."""
    return [m.weight.numel() for m in workload.model.modules() if isinstance(m, torch.nn.Linear)]


def write_atomically(path: Path, data: bytes) -> None:
    """Write beside the target, then rename: an interrupted dump never leaves a truncated file behind."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def record(
    cfg: WorkloadConfig,
    steps: int = 1,
    warmup: int = 1,
    max_entries: int = DEFAULT_MAX_ENTRIES,
    output_dir: str | Path = DEFAULT_OUTPUT_DIR,
    on_progress: Callable[[str], None] | None = None,
) -> RecordResult:
    """Run `warmup` unrecorded steps, record `steps` steps, write `<tag>.pickle` and `<tag>.json` in
    output_dir."""
    require_cuda(cfg)
    for name, value, least in (("steps", steps, 1), ("warmup", warmup, 0), ("max_entries", max_entries, 1)):
        if value < least:
            raise ProfilerKitError(f"{name} must be at least {least}, got {value}")
    progress = on_progress or (lambda message: None)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    snapshot_file = output_dir / f"{cfg.tag()}.pickle"
    workload = None
    try:
        progress(f"building {cfg.model} (ctx {cfg.ctx}, {cfg.mode})")
        try:
            workload = Workload(cfg)
        except torch.cuda.OutOfMemoryError as exc:
            raise ProfilerKitError(f"out of memory building {cfg.model} ({oom_summary(exc)})") from None
        warmup_oom = None
        for i in range(warmup):
            progress(f"warm-up step {i + 1}/{warmup}")
            try:
                workload.step()
            except torch.cuda.OutOfMemoryError as exc:
                # The recorded step will fail the same way, now with history on: that is the snapshot to keep.
                warmup_oom = oom_summary(exc)
                progress(f"warm-up ran out of memory ({warmup_oom}); recording the failing step")
                break
        synchronize(workload.device)
        meter = _PhaseMeter(workload.device, workload.phases)
        oom = None
        start_history(max_entries)
        try:
            for step in range(steps):
                progress(f"recording step {step + 1}/{steps}")
                meter.start_step(step)
                try:
                    workload.step(on_phase_end=meter)
                except torch.cuda.OutOfMemoryError as exc:
                    phase = meter.failed_phase()
                    meter(phase, completed=False)
                    oom = {"step": step, "phase": phase, "summary": oom_summary(exc), "message": str(exc)}
                    break
            synchronize(workload.device)
            # Peaks since the last phase end (after an OOM: up to the failed allocation).
            tail_allocated = torch.cuda.max_memory_allocated(workload.device)
            tail_reserved = torch.cuda.max_memory_reserved(workload.device)
            progress("taking the snapshot")
            snapshot = torch.cuda.memory._snapshot()
        finally:
            meter.close()
            torch.cuda.memory._record_memory_history(enabled=None)
        sidecar = {
            "format": SIDECAR_FORMAT,
            "version": SIDECAR_VERSION,
            "snapshot": snapshot_file.name,
            "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "torch_version": torch.__version__,
            "device_name": torch.cuda.get_device_name(workload.device),
            "config": cfg.as_dict(),
            "steps": steps,
            "warmup": warmup,
            "max_entries": max_entries,
            "stacks": STACKS,
            "peak_allocated_bytes": max([r["peak_allocated_bytes"] for r in meter.rows] + [tail_allocated]),
            "peak_reserved_bytes": max([r["peak_reserved_bytes"] for r in meter.rows] + [tail_reserved]),
            "phases": meter.rows,
            "warmup_oom": warmup_oom,
            "oom": oom,
            STORAGES_KEY: storages_at_snapshot(workload),
            "linear_weight_numels": linear_weight_numels(workload),
        }
        side_text = json.dumps(sidecar, indent=1) + "\n"
        # The JSON round trip stores plain containers only (torch's version string is a str subclass, which the
        # restricted unpickler refuses), i.e. exactly what the sidecar file holds.
        snapshot[EMBEDDED_KEY] = json.loads(side_text)
        write_atomically(snapshot_file, pickle.dumps(snapshot, protocol=SNAPSHOT_PICKLE_PROTOCOL))
        del snapshot
    finally:
        release(workload)
    side_file = sidecar_path(snapshot_file)
    write_atomically(side_file, side_text.encode())
    return RecordResult(snapshot_file, side_file, sidecar)
