"""End-to-end timing of forward / backward / optimizer phases of a TransformerLM step.

Honest timing: warm-up steps run first and are never timed; each timed step reads the host clock only after
synchronizing the device, at the step's start and at every phase boundary; exactly `steps` steps are timed.
Each config runs in isolation: an OOM or another error marks its row and the sweep goes on.
"""

from __future__ import annotations

import itertools
import re
import statistics
import time
from collections.abc import Iterable
from dataclasses import replace

import torch

from profiler_kit.errors import ProfilerKitError, first_line
from profiler_kit.flops import mfu_pct, step_flops
from profiler_kit.presets import count_parameters
from profiler_kit.workload import Workload, WorkloadConfig, release, synchronize

# Row columns, in display order. Times are milliseconds per step; *_ms is the mean.
PHASE_COLUMNS = {"forward": "forward", "backward": "backward", "optimizer_step": "optimizer"}
KEY_COLUMNS = ("model", "ctx", "mode", "batch_size", "mixed_precision", "compile", "attention")
COLUMNS = (
    *KEY_COLUMNS,
    "device",
    "status",
    "steps",
    "warmup",
    *(f"{p}_ms{s}" for p in PHASE_COLUMNS.values() for s in ("", "_std", "_median")),
    "total_ms",
    "total_ms_std",
    "total_ms_median",
    "tokens_per_s",
    "model_tflops",
    "mfu_pct",
    "peak_allocated_mb",
    "peak_reserved_mb",
    "params",
    "message",
)
MB = 2**20
# How PyTorch's CPU allocator reports a failed allocation ("DefaultCPUAllocator: can't allocate memory: you
# tried to allocate N bytes").
HOST_OOM = re.compile(r"can't allocate memory|not enough memory", re.IGNORECASE)


def _stats(samples: list[float]) -> tuple[float, float, float]:
    """Mean, sample standard deviation and median of seconds, in milliseconds."""
    ms = [s * 1e3 for s in samples]
    std = statistics.stdev(ms) if len(ms) > 1 else 0.0
    return statistics.fmean(ms), std, statistics.median(ms)


def time_steps(workload: Workload, warmup: int, steps: int) -> dict[str, list[float]]:
    """Run `warmup` untimed steps, then time `steps` steps. Returns seconds per step for each phase and `total`."""
    device = workload.device
    for _ in range(warmup):
        workload.step()
    synchronize(device)
    samples: dict[str, list[float]] = {p: [] for p in (*workload.phases, "total")}
    for _ in range(steps):
        synchronize(device)
        start = last = time.perf_counter()

        def on_phase_end(phase: str) -> None:
            nonlocal last
            synchronize(device)
            now = time.perf_counter()
            samples[phase].append(now - last)
            last = now

        workload.step(on_phase_end)
        samples["total"].append(last - start)
    return samples


def device_label(device: torch.device) -> str:
    """What a row's `device` column says: the GPU's name, or cpu."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _base_row(cfg: WorkloadConfig, warmup: int, steps: int) -> dict:
    row: dict = dict.fromkeys(COLUMNS)
    row.update({k: getattr(cfg, k) for k in KEY_COLUMNS})
    row.update(device=cfg.device, steps=steps, warmup=warmup, message="")
    return row


def run_config(cfg: WorkloadConfig, warmup: int, steps: int) -> dict:
    """Benchmark one config; never raises for OOMs or runtime errors (they become the row's status)."""
    row = _base_row(cfg, warmup, steps)
    workload = None
    try:
        workload = Workload(cfg)
        device = workload.device
        row["device"] = device_label(device)
        row["params"] = count_parameters(workload.model_cfg)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        samples = time_steps(workload, warmup, steps)
        for phase, column in PHASE_COLUMNS.items():
            if samples.get(phase):
                row[f"{column}_ms"], row[f"{column}_ms_std"], row[f"{column}_ms_median"] = _stats(
                    samples[phase]
                )
        row["total_ms"], row["total_ms_std"], row["total_ms_median"] = _stats(samples["total"])
        seconds = row["total_ms"] / 1e3
        row["tokens_per_s"] = cfg.batch_size * cfg.ctx / seconds
        flops = step_flops(workload.model_cfg, cfg.batch_size, cfg.ctx, cfg.mode)
        row["model_tflops"] = flops / seconds / 1e12
        row["mfu_pct"] = mfu_pct(row["model_tflops"], row["device"], cfg.mixed_precision)
        if device.type == "cuda":
            row["peak_allocated_mb"] = torch.cuda.max_memory_allocated(device) / MB
            row["peak_reserved_mb"] = torch.cuda.max_memory_reserved(device) / MB
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
        row.update(
            status="error", message=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        )
    finally:
        release(workload)
        del workload
    return row


def sweep_configs(
    base: WorkloadConfig, models: Iterable[str], ctxs: Iterable[int], modes: Iterable[str]
) -> list[WorkloadConfig]:
    """The product models × ctxs × modes, validated up front so a typo fails before any GPU time is spent."""
    configs = [replace(base, model=m, ctx=c, mode=md) for m, c, md in itertools.product(models, ctxs, modes)]
    for cfg in configs:
        cfg.validate()
    return configs
