"""Recording the built-in workload (`profiler-kit nsys --model ...`, `make nsys`, `profiler-kit memory --model
...`) and the attention implementations (`profiler-kit nsys attention`): each is a program, `python -m
profiler_kit.recording.targets --spec JSON`, recorded through `runner.run_program` like any other, under Nsight
Systems, torch.profiler or the memory history.

Outputs are named by the config: `<output_dir>/<model>_ctx<ctx>_<mode>[_bf16][.rank<R>].{nsys-rep,sqlite,json.gz}`;
a memory recording writes `<output_dir>/<tag>.pickle` and its metadata beside it as `<tag>.json` (the sidecar),
replacing earlier ones.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from profiler_kit import distributed
from profiler_kit.defaults import DEFAULT_MAX_ENTRIES, DEFAULT_OUTPUT_DIR
from profiler_kit.device import resolve_device
from profiler_kit.errors import ProfilerKitError
from profiler_kit.files import replaced_when_complete
from profiler_kit.names import BACKWARD, FORWARD
from profiler_kit.nsys_tool import hint_for
from profiler_kit.recording.runner import BACKENDS, MEMORY, ParentWindow, ProgramRun, cuda_device_present, run_program
from profiler_kit.workload import WorkloadConfig, phases_for


@dataclass(frozen=True)
class ProfileResult:
    """What a recording wrote: `window` says what it holds; `phases` are the NVTX ranges to summarize,
    `sources` the files the summary reads (the SQLite export, or the Chrome trace)."""

    backend: str
    tag: str
    device: str
    window: ParentWindow
    phases: tuple[str, ...]
    paths: tuple[Path, ...] = ()
    sources: tuple[Path, ...] = ()

    @property
    def summary_source(self) -> Path:
        if not self.sources:
            raise ProfilerKitError(f"{self.tag}: nothing was recorded")
        return self.sources[0]


@dataclass(frozen=True)
class AttentionProfileConfig:
    """One attention shape, profiled for each implementation in `impls` (names of `attention bench`)."""

    impls: tuple[str, ...]
    dtype: str = "bf16"
    causal: bool = True
    batch: int = 8
    heads: int | None = None  # None: inputs without a head dimension, (batch, seq, d), as `attention bench`
    seq: int = 4096
    d: int = 64
    device: str = "auto"

    def validate(self) -> None:
        from profiler_kit.attention.registry import DTYPES, NAMES

        unknown = [impl for impl in self.impls if impl not in NAMES]
        if unknown or not self.impls:
            raise ProfilerKitError(f"unknown implementation {', '.join(unknown) or '(none)'}; "
                                   f"choose from {', '.join(NAMES)}")
        if self.dtype not in DTYPES:
            raise ProfilerKitError(f"unknown dtype {self.dtype!r}; choose from {', '.join(DTYPES)}")
        for field in ("batch", "heads", "seq", "d"):
            if getattr(self, field) is not None and getattr(self, field) <= 0:
                raise ProfilerKitError(f"{field} must be positive, got {getattr(self, field)}")

    def tag(self) -> str:
        """File-name stem: `attention_<dtype>_b<batch>[_h<heads>]_s<seq>_d<d>[_causal]`."""
        heads = "" if self.heads is None else f"_h{self.heads}"
        shape = f"b{self.batch}{heads}_s{self.seq}_d{self.d}"
        return f"attention_{self.dtype}_{shape}" + ("_causal" if self.causal else "")

    def phases(self) -> tuple[str, ...]:
        return tuple(f"{impl}.{phase}" for impl in self.impls for phase in (FORWARD, BACKWARD))


def profile(cfg: WorkloadConfig, warmup: int, steps: int, backend: str, output_dir: Path,
            nsys_path: str | os.PathLike | None = None, force: bool = False) -> ProfileResult:
    """Record `steps` training steps of `cfg` after `warmup` unrecorded ones. Data-parallel configs run under
    torchrun, one recording per rank, its name ending in `.rank<R>` (the recorded child process takes this
    rank's place in the process group)."""
    cfg.validate()
    device = resolve_device(cfg.device)
    spec = {"workload": {**cfg.as_dict(), "device": str(device)}}
    tag = cfg.tag() if cfg.parallel == "none" else f"{cfg.tag()}.rank{distributed.torchrun_rank().rank}"
    return _record(spec, tag, device, phases_for(cfg.mode), warmup, steps, backend, Path(output_dir),
                   nsys_path, force)


def workload_flops(cfg: WorkloadConfig) -> tuple[dict[str, float], float | None]:
    """FLOPs per range of each phase of `cfg` (forward F, backward 2F) and this machine's GPU peak in TFLOP/s
    for its precision (None without CUDA or for an unlisted GPU)."""
    from profiler_kit.flops import BACKWARD_FACTOR, forward_flops, gpu_peak
    from profiler_kit.presets import from_name

    fwd = forward_flops(from_name(cfg.model, cfg.ctx), cfg.batch_size, cfg.ctx)
    per_phase = {FORWARD: fwd, BACKWARD: fwd * BACKWARD_FACTOR}
    device = resolve_device(cfg.device)
    peak = gpu_peak(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    if peak is None:
        return per_phase, None
    return per_phase, peak.bf16_tflops if cfg.mixed_precision else peak.fp32_tflops


def profile_attention(cfg: AttentionProfileConfig, warmup: int, steps: int, backend: str, output_dir: Path,
                      nsys_path: str | os.PathLike | None = None, force: bool = False) -> ProfileResult:
    """Record `steps` forward+backward passes of each attention implementation after `warmup` ones."""
    cfg.validate()
    device = resolve_device(cfg.device)
    spec = {"attention": {**asdict(cfg), "impls": list(cfg.impls), "device": str(device)}}
    return _record(spec, cfg.tag(), device, cfg.phases(), warmup, steps, backend, Path(output_dir), nsys_path,
                   force)


def target_command(spec: dict, warmup: int, steps: int) -> list[str]:
    """The built-in workload as a program: `python -m profiler_kit.recording.targets --spec JSON`."""
    return [sys.executable, "-m", "profiler_kit.recording.targets", "--spec",
            json.dumps({**spec, "warmup": warmup, "steps": steps})]


def _record(spec: dict, tag: str, device: torch.device, phases: tuple[str, ...], warmup: int, steps: int,
            backend: str, output_dir: Path, nsys_path: str | os.PathLike | None, force: bool) -> ProfileResult:
    if backend not in BACKENDS:
        raise ProfilerKitError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
    if warmup < 0 or steps < 1:
        raise ProfilerKitError(f"need warmup ≥ 0 and steps ≥ 1, got warmup={warmup}, steps={steps}")
    run = run_program(target_command(spec, warmup, steps), backend, output_dir / tag, nsys_path, force=force)
    if run.exit_code != 0:
        raise ProfilerKitError(_failure(tag, run))
    return ProfileResult(backend, tag, str(device), run.window, phases, run.files, run.sources)


NO_CUDA_MESSAGE = (
    "memory snapshots need a CUDA device, and torch sees none here; "
    "`profiler-kit memory summarize FILE.pickle` reads existing snapshots anywhere"
)


@dataclass(frozen=True)
class RecordResult:
    """A memory recording of the built-in workload: the snapshot, its sidecar and the sidecar's content."""

    snapshot_path: Path
    sidecar_path: Path
    sidecar: dict
    warmup: int

    @property
    def oom(self) -> dict | None:
        """{"step", "phase", "summary", "message"} when a step ran out of memory, `step` counted among the
        recorded steps (negative: a warm-up step)."""
        oom = self.sidecar.get("oom")
        return None if oom is None else {**oom, "step": oom["step"] - self.warmup}


def require_cuda(cfg: WorkloadConfig) -> None:
    if cfg.device == "cpu" or not cuda_device_present():
        raise ProfilerKitError(NO_CUDA_MESSAGE)


def record_memory(cfg: WorkloadConfig, steps: int = 1, warmup: int = 1, max_entries: int = DEFAULT_MAX_ENTRIES,
                  output_dir: str | Path = DEFAULT_OUTPUT_DIR,
                  on_progress: Callable[[str], None] | None = None) -> RecordResult:
    """Run `warmup` unrecorded steps of `cfg`, record the memory history of `steps` steps (the memory recorder
    of `profiler-kit memory -- COMMAND`, `history`), write `<tag>.pickle` and `<tag>.json` in `output_dir`.
    A step that runs out of memory still leaves its snapshot (`RecordResult.oom` says where)."""
    require_cuda(cfg)
    for name, value, least in (("steps", steps, 1), ("warmup", warmup, 0), ("max_entries", max_entries, 1)):
        if value < least:
            raise ProfilerKitError(f"{name} must be at least {least}, got {value}")
    cfg.validate()
    (on_progress or (lambda message: None))(f"recording {cfg.model} (ctx {cfg.ctx}, {cfg.mode})")
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    spec = {"workload": {**cfg.as_dict(), "device": str(resolve_device(cfg.device))}}
    run = run_program(target_command(spec, warmup, steps), MEMORY, output_dir / cfg.tag(), force=True,
                      max_entries=max_entries)
    if not run.files:
        raise ProfilerKitError(_failure(cfg.tag(), run))
    from profiler_kit.memory.snapshot import EMBEDDED_KEY, load_snapshot, sidecar_path

    snapshot = run.files[0]
    sidecar = load_snapshot(snapshot)[EMBEDDED_KEY]
    side_file = sidecar_path(snapshot)
    with replaced_when_complete(side_file) as tmp:
        tmp.write_text(json.dumps(sidecar, indent=1) + "\n")
    result = RecordResult(snapshot, side_file, sidecar, warmup)
    if run.exit_code != 0 and result.oom is None:
        raise ProfilerKitError(_failure(cfg.tag(), run))
    return result


def _failure(tag: str, run: ProgramRun) -> str:
    """The workload's own error line when it printed one, with the likeliest cause; else its exit status."""
    if run.errors:
        hint = hint_for(run.errors[-1])
        return f"profiling {tag} failed: {run.errors[-1]}" + (f" — hint: {hint}" if hint else "")
    hint = hint_for(run.tail)
    return (f"profiling {tag} failed (exit status {run.exit_code})" + (f": {run.tail}" if run.tail else "")
            + (f" — hint: {hint}" if hint else ""))
