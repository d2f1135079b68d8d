"""End-to-end timing of forward / backward / optimizer phases of a TransformerLM step.

How a config is timed:
- Warm-up: at least `warmup` untimed steps, then more until the step time stops changing (the median of the
  last `STABLE_WINDOW` steps within `stable_pct` of the median of the window before), at most `max_warmup`.
  Rows report how many warm-up steps ran and whether the time settled before the cap.
- Exactly `steps` timed steps follow. Each starts on an idle device and ends with one synchronize: `total_ms` is
  the wall time of the step on the host clock; phase times come from CUDA events recorded at the phase
  boundaries (on a CPU, from the host clock there, since CPU work is done when a phase returns; for a step
  captured whole as one CUDA graph, from the events its replay records). Nothing synchronizes inside a step, so
  the launch queue is never drained between phases.
- `opt_exposed_ms` is how much longer the step is than its backward: the `optimizer_step` phase, all of the
  update when it runs after the backward, the part left when the update runs beside it.
- `cpu_threads` sets torch's intra-op threads for the config (on a CPU whose cores other processes share, fewer
  threads than cores keep one preempted thread from stalling every parallel op); rows record the count.
- Python's garbage collector is off from the first warm-up step to the last timed step (one collection right
  before timing), and nothing in this module reports progress between the timed steps.
Each config runs in isolation: an OOM or another error marks its row and the sweep goes on.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import re
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd
import torch

from profiler_kit.defaults import STABLE_WINDOW
from profiler_kit.device import device_label, resolve_device, synchronize
from profiler_kit.errors import ProfilerKitError, first_line
from profiler_kit.flops import mfu_pct, step_flops
from profiler_kit.names import BACKWARD, FORWARD, OPTIMIZER_STEP
from profiler_kit.presets import count_parameters
from profiler_kit.workload import Workload, WorkloadConfig, release

# Row columns, in display order. Times are milliseconds per step; *_ms is the mean. Per step: each phase, the
# step's wall time (`total`), and the CPU time the process spent on the step until it returned (`host_cpu`).
TIME_COLUMNS = {FORWARD: "forward", BACKWARD: "backward", OPTIMIZER_STEP: "optimizer", "total": "total",
                "host_cpu": "host_cpu"}
STAT_SUFFIXES = ("", "_std", "_median", "_p10", "_p90")
CONFIG_COLUMNS = ("model", "ctx", "mode", "batch_size", "mixed_precision", "compile", "cuda_graphs", "attention",
                  "optimizer", "optimizer_overlap", "clip_grad_norm")
KEY_COLUMNS = (*CONFIG_COLUMNS, "repeat")
# What changes a measurement besides its config; `--resume` counts a row as done only when these match.
# `warmup_min`/`max_warmup`/`stable_pct` are the warm-up options, `warmup` the number of warm-up steps that ran.
SETTING_COLUMNS = ("device", "steps", "warmup_min", "max_warmup", "stable_pct", "cpu_threads", "nvtx", "seed")
COLUMNS = (
    *KEY_COLUMNS,
    "device",
    "status",
    "steps",
    "warmup_min",
    "max_warmup",
    "stable_pct",
    "warmup",
    "warmup_stable",
    "cpu_threads",
    "nvtx",
    "seed",
    *(f"{p}_ms{s}" for p in TIME_COLUMNS.values() for s in STAT_SUFFIXES),
    "opt_exposed_ms",
    "tokens_per_s",
    "model_tflops",
    "mfu_pct",
    "peak_allocated_mib",
    "peak_reserved_mib",
    "params",
    "message",
)
MIB = 2**20
# How PyTorch's CPU allocator reports a failed allocation ("DefaultCPUAllocator: can't allocate memory: you
# tried to allocate N bytes").
HOST_OOM = re.compile(r"can't allocate memory|not enough memory", re.IGNORECASE)


@dataclass(frozen=True)
class TimingOptions:
    """Warm-up bounds, the number of timed steps, when the warm-up counts as settled, and torch's intra-op
    threads (None: torch's default)."""

    warmup: int = 5
    max_warmup: int = 50
    steps: int = 10
    stable_pct: float = 2.0
    cpu_threads: int | None = None

    def validate(self) -> None:
        if self.warmup < 0 or self.steps < 1 or self.stable_pct <= 0 or (self.cpu_threads or 1) < 1:
            raise ProfilerKitError(f"need warmup ≥ 0, steps ≥ 1, stable_pct > 0 and cpu_threads ≥ 1, got {self}")


@dataclass(frozen=True)
class SweepItem:
    """One run of a config in a sweep: `repeat` counts from 1 when each config runs several times."""

    cfg: WorkloadConfig
    repeat: int = 1

    def as_dict(self) -> dict[str, Any]:
        return {**self.cfg.as_dict(), "repeat": self.repeat}


@dataclass
class Timing:
    """Seconds per timed step for each phase and `total`; the warm-up steps run and whether they settled."""

    samples: dict[str, list[float]]
    warmup_steps: int
    warmup_stable: bool


class StepTimer:
    """Times one step: its wall time on the host clock, from an idle device to the synchronize after its last
    phase; each phase from the marks at the phase boundaries (CUDA events on a GPU, the host clock on a CPU); and
    the CPU time of the whole process (every thread: the autograd engine's launches too) from the step's start to
    its return, before the synchronize, whose wait may spin. On a GPU a `host_cpu` close to `total` means the
    host, not the GPU, sets the step's length."""

    def __init__(self, device: torch.device, phases: Sequence[str],
                 recorded: Callable[[], list[torch.cuda.Event] | None] | None = None) -> None:
        self.device = device
        self.phases = tuple(phases)
        # The events a step captured as a CUDA graph records itself (step start, each phase's end), if any.
        self.recorded = recorded
        self.uses_events = device.type == "cuda"
        if self.uses_events:
            self.events = [torch.cuda.Event(enable_timing=True) for _ in range(len(self.phases) + 1)]

    def _mark(self, index: int) -> float:
        if self.uses_events:
            self.events[index].record()
            return 0.0
        return time.perf_counter()

    def run(self, step: Callable[[Callable[[str], None] | None], object], phases: bool = True) -> dict[str, float]:
        """Run `step` once and return its seconds: `total`, and each phase and `host_cpu` when `phases` (warm-up
        steps are run without phase marks)."""
        marks: list[float] = []

        def on_phase_end(phase: str) -> None:
            marks.append(self._mark(len(marks)))

        start, cpu_start = time.perf_counter(), time.process_time()
        if phases:
            marks.append(self._mark(0))
        step(on_phase_end if phases else None)
        host_cpu = time.process_time() - cpu_start
        synchronize(self.device)
        out = {"total": time.perf_counter() - start}
        if not phases:
            return out
        out["host_cpu"] = host_cpu
        events = self.recorded() if self.recorded else None
        if events is None and len(marks) != len(self.phases) + 1:
            raise RuntimeError(f"the step ended {len(marks) - 1} phases, expected {len(self.phases)}")
        events = events or (self.events if self.uses_events else None)
        for i, phase in enumerate(self.phases):
            if events:
                out[phase] = events[i].elapsed_time(events[i + 1]) / 1e3
            else:
                out[phase] = marks[i + 1] - marks[i]
        return out


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off inside the block (after one collection), restored after it."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextlib.contextmanager
def intra_op_threads(threads: int | None) -> Iterator[None]:
    """torch's intra-op thread count set to `threads` inside the block (unchanged for None), restored after it."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def settled(totals: Sequence[float], stable_pct: float, window: int = STABLE_WINDOW) -> bool:
    """Whether the median of the last `window` step times is within `stable_pct` of the median of the window
    before it (medians: one slow step does not restart the wait)."""
    if len(totals) < 2 * window:
        return False
    last = statistics.median(totals[-window:])
    before = statistics.median(totals[-2 * window : -window])
    return abs(last - before) <= stable_pct / 100 * last


def time_steps(
    workload: Workload, timing: TimingOptions, on_status: Callable[[str], None] | None = None
) -> Timing:
    """Warm up until the step time settles (within the bounds of `timing`), then time exactly `timing.steps`
    steps. `on_status` hears about the warm-up between its steps and once before the timed steps, never during
    them."""
    # A workload whose step is captured as one CUDA graph says where its replays record the phase boundaries.
    timer = StepTimer(workload.device, workload.phases, getattr(workload, "phase_events", None))
    warm: list[float] = []
    with collector_paused():
        synchronize(workload.device)
        while len(warm) < timing.warmup or (
            len(warm) < timing.max_warmup and not settled(warm, timing.stable_pct)
        ):
            if on_status:
                on_status(f"warm-up {len(warm) + 1}")
            warm.append(timer.run(workload.step, phases=False)["total"])
        if on_status:
            on_status(f"timing {timing.steps} steps")
        gc.collect()
        samples: dict[str, list[float]] = {p: [] for p in (*workload.phases, "total", "host_cpu")}
        for _ in range(timing.steps):
            for phase, seconds in timer.run(workload.step).items():
                samples[phase].append(seconds)
    return Timing(samples, len(warm), settled(warm, timing.stable_pct))


def step_stats(samples: list[float]) -> dict[str, float]:
    """Mean, sample standard deviation, median, 10th and 90th percentiles of seconds, in milliseconds, keyed by
    the column suffixes."""
    ms = [s * 1e3 for s in samples]
    if len(ms) > 1:
        deciles = statistics.quantiles(ms, n=10, method="inclusive")
        std, p10, p90 = statistics.stdev(ms), deciles[0], deciles[-1]
    else:
        std, p10, p90 = 0.0, ms[0], ms[0]
    values = (statistics.fmean(ms), std, statistics.median(ms), p10, p90)
    return dict(zip(STAT_SUFFIXES, values, strict=True))


def _base_row(item: SweepItem, timing: TimingOptions) -> dict:
    row: dict = dict.fromkeys(COLUMNS)
    row.update({k: getattr(item.cfg, k) for k in CONFIG_COLUMNS})
    row.update(repeat=item.repeat, device=item.cfg.device, steps=timing.steps, warmup_min=timing.warmup,
               max_warmup=timing.max_warmup, stable_pct=timing.stable_pct, nvtx=item.cfg.nvtx, seed=item.cfg.seed,
               warmup=0, message="")
    return row


def settings(base: WorkloadConfig, timing: TimingOptions) -> dict[str, Any]:
    """The values of SETTING_COLUMNS that a row measured with `base`'s device, NVTX and seed and with `timing` has
    (what `--resume` matches); `cpu_threads` only when `timing` sets it, since torch's default is the machine's."""
    values = {"device": device_label(resolve_device(base.device)), "steps": timing.steps,
              "warmup_min": timing.warmup, "max_warmup": timing.max_warmup, "stable_pct": timing.stable_pct,
              "nvtx": base.nvtx, "seed": base.seed}
    if timing.cpu_threads is not None:
        values["cpu_threads"] = timing.cpu_threads
    return values


def run_config(
    item: SweepItem | WorkloadConfig, timing: TimingOptions, on_status: Callable[[str], None] | None = None
) -> dict:
    """Benchmark one config; never raises for OOMs or runtime errors (they become the row's status)."""
    item = item if isinstance(item, SweepItem) else SweepItem(item)
    cfg = item.cfg
    row = _base_row(item, timing)
    workload = None
    try:
        timing.validate()
        workload = Workload(cfg)
        device = workload.device
        row["device"] = device_label(device)
        row["params"] = count_parameters(workload.model_cfg)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        with intra_op_threads(timing.cpu_threads):
            row["cpu_threads"] = torch.get_num_threads()
            result = time_steps(workload, timing, on_status)
        row.update(warmup=result.warmup_steps, warmup_stable=result.warmup_stable)
        for phase, column in TIME_COLUMNS.items():
            if result.samples.get(phase):
                row.update({f"{column}_ms{k}": v for k, v in step_stats(result.samples[phase]).items()})
        row["opt_exposed_ms"] = row["optimizer_ms"]
        row["message"] = "; ".join(workload.notes)
        seconds = row["total_ms"] / 1e3
        row["tokens_per_s"] = cfg.batch_size * cfg.ctx / seconds
        flops = step_flops(workload.model_cfg, cfg.batch_size, cfg.ctx, cfg.mode)
        row["model_tflops"] = flops / seconds / 1e12
        row["mfu_pct"] = mfu_pct(row["model_tflops"], row["device"], cfg.mixed_precision)
        if device.type == "cuda":
            row["peak_allocated_mib"] = torch.cuda.max_memory_allocated(device) / MIB
            row["peak_reserved_mib"] = torch.cuda.max_memory_reserved(device) / MIB
        row["status"] = "ok"
    except torch.OutOfMemoryError as exc:
        row.update(status="oom", message=str(exc).splitlines()[0])
    except (MemoryError, RuntimeError) as exc:
        # Host memory: Python's MemoryError, or the CPU allocator's RuntimeError; any other RuntimeError is an error.
        if not isinstance(exc, MemoryError) and not HOST_OOM.search(str(exc)):
            row.update(status="error", message=first_line(exc))
        else:
            row.update(status="oom", message=f"out of host memory: {first_line(exc)}")
    except ProfilerKitError:
        raise
    except Exception as exc:  # one broken config must not end the sweep: record it and go on
        row.update(status="error", message=first_line(exc))
    finally:
        release(workload)
        del workload
    return row


def sweep_configs(
    base: WorkloadConfig,
    models: Iterable[str],
    ctxs: Iterable[int],
    modes: Iterable[str],
    attentions: Iterable[str] | None = None,
    optimizers: Iterable[str] | None = None,
) -> list[WorkloadConfig]:
    """The product models × ctxs × modes × attentions × optimizers (the last two default to the base's),
    validated up front so a typo fails before any GPU time is spent."""
    axes = itertools.product(models, ctxs, modes, attentions or [base.attention], optimizers or [base.optimizer])
    configs = [replace(base, model=m, ctx=c, mode=md, attention=a, optimizer=o) for m, c, md, a, o in axes]
    for cfg in configs:
        cfg.validate()
    return configs


def sweep_items(configs: Sequence[WorkloadConfig], repeat: int = 1) -> list[SweepItem]:
    """Each config `repeat` times, interleaved: the whole sweep once, then again, so that a drift of the machine
    over the sweep shows up as a spread across repeats instead of a difference between configs."""
    if repeat < 1:
        raise ProfilerKitError(f"repeat must be ≥ 1, got {repeat}")
    return [SweepItem(cfg, r) for r in range(1, repeat + 1) for cfg in configs]


def across_repeats(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per config run more than once: its repeats' median step times and their spread,
    `(max - min) / mean` of the repeats' medians in percent."""
    ok = rows[rows["status"] == "ok"]
    columns = [*CONFIG_COLUMNS, "repeats", "total_ms_median", "total_ms_median_min", "total_ms_median_max",
               "repeat_spread_pct"]  # fmt: skip
    if ok.empty:
        return pd.DataFrame(columns=columns)
    keys = list(CONFIG_COLUMNS)
    grouped = ok.groupby(keys, sort=False, dropna=False)["total_ms_median"]
    out = grouped.agg(repeats="count", total_ms_median="mean", total_ms_median_min="min",
                      total_ms_median_max="max").reset_index()  # fmt: skip
    out["repeat_spread_pct"] = (out["total_ms_median_max"] - out["total_ms_median_min"]) / out["total_ms_median"] * 100
    return out[out["repeats"] > 1][columns].reset_index(drop=True)
