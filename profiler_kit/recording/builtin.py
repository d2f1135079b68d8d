"""Recording a workload's kernels: under Nsight Systems, or with torch.profiler when there is no nsys.

nsys backend: the target runs in a child process (`python -m profiler_kit.recording.targets`) under `nsys
profile --trace=cuda,nvtx`. On a GPU the child's warm-up steps run before a `cudaProfilerApi` capture range
that holds only the profiled steps (`--capture-range-end=stop`), so compilation, autotuning and allocator
growth stay out of the report. On a CPU there is no CUDA to open that range, so the whole run is recorded,
the warm-up steps in an NVTX range `warmup`. (An NVTX capture range would work without CUDA, but an nsys that
drops the `nvtx` package's ranges, as Debian's 2022.4 does, would then record nothing at all.) The report is
then exported to SQLite beside it.

torch backend: in this process, torch.profiler records the profiled steps, with every NVTX range of the
workload also a `record_function`, into a gzipped Chrome trace that Perfetto opens.

Outputs are named by the config: `<output_dir>/<model>_ctx<ctx>_<mode>[_bf16].{nsys-rep,sqlite,json.gz}`.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from profiler_kit import distributed
from profiler_kit.recording import ranges as nvtx_ranges
from profiler_kit.errors import ProfilerKitError
from profiler_kit.files import check_output
from profiler_kit.recording.nsys import (
    NsysError,
    NsysInstall,
    export_sqlite,
    failure_message,
    find_nsys,
    hint_for,
    publish_report,
    run,
)
from profiler_kit.recording.targets import NOTE_PREFIX, build_target, drive
from profiler_kit.render import console_err
from profiler_kit.workload import WorkloadConfig, phases_for, resolve_device

BACKENDS = ("nsys", "torch")
# Fewer options than nsys's defaults: no CPU sampling or context switches, which would grow the report and
# need perf_event permissions, and nothing recorded but CUDA API/kernels/memory operations and NVTX. Kernels
# that a CUDA graph replays are recorded one by one, so a `--cuda-graphs` step breaks down like any other.
NSYS_PROFILE_ARGS = ("profile", "--trace=cuda,nvtx", "--sample=none", "--cpuctxsw=none",
                     "--cuda-graph-trace=node", "--force-overwrite=true")
CUDA_CAPTURE_ARGS = ("--capture-range=cudaProfilerApi", "--capture-range-end=stop")


@dataclass(frozen=True)
class ProfileResult:
    """What a recording wrote. `capture` says what it holds: `cudaProfilerApi` (the profiled steps only),
    `none` (the whole run, warm-up included) or `torch.profiler`. `phases`: the NVTX ranges to summarize."""

    backend: str
    tag: str
    device: str
    capture: str
    phases: tuple[str, ...]
    report: Path | None = None
    sqlite: Path | None = None
    trace: Path | None = None

    @property
    def paths(self) -> list[Path]:
        return [p for p in (self.report, self.sqlite, self.trace) if p is not None]

    @property
    def summary_source(self) -> Path:
        """The file the kernel summary reads: the SQLite export, or the Chrome trace."""
        source = self.sqlite or self.trace
        if source is None:
            raise ProfilerKitError(f"{self.tag}: nothing was recorded")
        return source


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
        return tuple(f"{impl}.{phase}" for impl in self.impls for phase in ("forward", "backward"))


def profile(cfg: WorkloadConfig, warmup: int, steps: int, backend: str, output_dir: Path,
            nsys_path: str | os.PathLike | None = None) -> ProfileResult:
    """Record `steps` training steps of `cfg` after `warmup` unrecorded ones. Data-parallel configs run under
    torchrun, one recording per rank, its name ending in `.rank<R>` (under nsys, the recorded child process
    takes this rank's place in the process group)."""
    cfg.validate()
    device = resolve_device(cfg.device)
    spec = {"workload": {**cfg.as_dict(), "device": str(device)}}
    tag = cfg.tag() if cfg.parallel == "none" else f"{cfg.tag()}.rank{distributed.torchrun_rank().rank}"
    return _record(spec, tag, device, phases_for(cfg.mode), warmup, steps, backend, Path(output_dir),
                   nsys_path)


def workload_flops(cfg: WorkloadConfig) -> tuple[dict[str, float], float | None]:
    """FLOPs per range of each phase of `cfg` (forward F, backward 2F) and this machine's GPU peak in TFLOP/s
    for its precision (None without CUDA or for an unlisted GPU)."""
    from profiler_kit.flops import BACKWARD_FACTOR, forward_flops, gpu_peak
    from profiler_kit.presets import from_name

    fwd = forward_flops(from_name(cfg.model, cfg.ctx), cfg.batch_size, cfg.ctx)
    per_phase = {"forward": fwd, "backward": fwd * BACKWARD_FACTOR}
    device = resolve_device(cfg.device)
    peak = gpu_peak(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    if peak is None:
        return per_phase, None
    return per_phase, peak.bf16_tflops if cfg.mixed_precision else peak.fp32_tflops


def profile_attention(cfg: AttentionProfileConfig, warmup: int, steps: int, backend: str, output_dir: Path,
                      nsys_path: str | os.PathLike | None = None) -> ProfileResult:
    """Record `steps` forward+backward passes of each attention implementation after `warmup` ones."""
    cfg.validate()
    device = resolve_device(cfg.device)
    spec = {"attention": {**asdict(cfg), "impls": list(cfg.impls), "device": str(device)}}
    return _record(spec, cfg.tag(), device, cfg.phases(), warmup, steps, backend, Path(output_dir), nsys_path)


def _record(spec: dict, tag: str, device: torch.device, phases: tuple[str, ...], warmup: int, steps: int,
            backend: str, output_dir: Path, nsys_path: str | os.PathLike | None) -> ProfileResult:
    if backend not in BACKENDS:
        raise ProfilerKitError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
    if warmup < 0 or steps < 1:
        raise ProfilerKitError(f"need warmup ≥ 0 and steps ≥ 1, got warmup={warmup}, steps={steps}")
    # Look for nsys before anything slow: without it there is no point in starting.
    nsys = find_nsys(nsys_path) if backend == "nsys" else None
    # The folder must take the recording before any step runs, not after.
    check_output(output_dir / f"{tag}.nsys-rep")
    if nsys is not None:
        return _record_nsys(nsys, spec, tag, device, phases, warmup, steps, output_dir)
    trace = output_dir / f"{tag}.json.gz"
    try:
        drive(build_target(spec, note=_note), warmup, steps, torch_recording(device, trace))
    except torch.cuda.OutOfMemoryError:
        raise ProfilerKitError(f"profiling {tag} failed — hint: {hint_for('out of memory')}") from None
    return ProfileResult("torch", tag, str(device), "torch.profiler", phases, trace=trace)


@contextlib.contextmanager
def torch_recording(device: torch.device, trace: Path) -> Iterator[None]:
    """torch.profiler over the block (CPU ops, and CUDA kernels on a GPU), NVTX ranges as `record_function`s;
    the Chrome trace is written to `trace` (gzipped when it ends in .gz) once the block succeeds."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    nvtx_ranges.set_record_function(True)
    try:
        with torch.profiler.profile(activities=activities) as prof:
            yield
    finally:
        nvtx_ranges.set_record_function(False)
    prof.export_chrome_trace(str(trace))


def _note(message: str) -> None:
    console_err.print(message, soft_wrap=True, markup=False, highlight=False)


def nsys_command(nsys: NsysInstall, output_stem: Path, capture: str, spec: dict) -> list[str]:
    """`nsys profile ... python -m profiler_kit.recording.targets --spec JSON`."""
    capture_args = CUDA_CAPTURE_ARGS if capture == "cudaProfilerApi" else ()
    child = [sys.executable, "-m", "profiler_kit.recording.targets", "--spec", json.dumps(spec)]
    return [str(nsys.path), *NSYS_PROFILE_ARGS, *capture_args, f"--output={output_stem}", *child]


def _child_env() -> dict[str, str]:
    """This environment, with this package importable in the child wherever it is started from."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}


def _record_nsys(nsys: NsysInstall, spec: dict, tag: str, device: torch.device, phases: tuple[str, ...],
                 warmup: int, steps: int, output_dir: Path) -> ProfileResult:
    capture = "cudaProfilerApi" if device.type == "cuda" else "none"
    if capture == "none":
        console_err.print(f"no CUDA device: nsys records the whole run, its {warmup} warm-up step(s) in NVTX "
                          "range 'warmup' (the cudaProfilerApi capture range needs CUDA)", soft_wrap=True)
    report = output_dir / f"{tag}.nsys-rep"
    # Recorded under another name: a failed run leaves the previous report (and its export) as they were.
    recorded = output_dir / f".{tag}.partial-{os.getpid()}.nsys-rep"
    cmd = nsys_command(nsys, recorded.with_suffix(""), capture, {**spec, "warmup": warmup, "steps": steps,
                                                                  "capture": capture})
    with console_err.status(f"nsys {nsys.version_str}: {tag}, {warmup} warm-up + {steps} profiled step(s)"):
        proc = run(cmd, env=_child_env())
    notes = [ln[len(NOTE_PREFIX):] for ln in proc.stderr.splitlines() if ln.startswith(NOTE_PREFIX)]
    for note in notes:
        _note(note)
    try:
        if proc.returncode != 0 or not recorded.is_file():
            raise NsysError(_profile_failure(cmd, proc, report, capture, recorded))
        publish_report(recorded, report)
    finally:
        recorded.unlink(missing_ok=True)
    sqlite = export_sqlite(report, nsys)
    return ProfileResult("nsys", tag, str(device), capture, phases, report=report, sqlite=sqlite)


def _profile_failure(cmd: list[str], proc: subprocess.CompletedProcess, report: Path, capture: str,
                     recorded: Path) -> str:
    """The workload's own error line when it printed one; else nsys's failure, with the likeliest cause."""
    errors = [ln.removeprefix("error: ") for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    if errors:
        hint = hint_for(errors[-1])
        return f"profiling {report.stem} failed: {errors[-1]}" + (f" — hint: {hint}" if hint else "")
    if proc.returncode != 0:
        return failure_message(cmd, proc)
    if recorded.with_suffix(".qdstrm").is_file():
        return failure_message(cmd, proc, f"left {recorded.with_suffix('.qdstrm')} but no report")
    reason = " (the workload never opened the cudaProfilerApi capture range)" if capture != "none" else ""
    return failure_message(cmd, proc, f"made no report{reason}")
