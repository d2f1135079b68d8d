"""The built-in workload data-parallel under torchrun: one rank per GPU (or CPU process), the model wrapped in
DistributedDataParallel (`ddp`) or sharded with FSDP2's `fully_shard` (`fsdp`), each rank on a batch of its own.

torchrun starts the ranks and says who each one is through its environment (RANK, WORLD_SIZE, LOCAL_RANK and
the rendezvous address); `join` reads it, sets this rank's GPU and opens the process group (NCCL on GPUs, gloo
on CPUs). `run_config` benchmarks one config on every rank and gathers the rows to rank 0, which adds an
aggregate row: the global batch's tokens over the slowest rank's step time. Scaling efficiency compares
throughput with a single-device baseline row of the same config: a rank's tokens/s over the baseline's, and the
aggregate's over world_size × the baseline's.
"""

from __future__ import annotations

import importlib
import os
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from profiler_kit.errors import ProfilerKitError
from profiler_kit.flops import mfu_pct
from profiler_kit.names import PARALLEL_MODES

if TYPE_CHECKING:
    from profiler_kit.workload import WorkloadConfig

# Columns a data-parallel row adds to a benchmark row; `rank` is "all" on the aggregate row.
RANK_COLUMNS = ("parallel", "world_size", "rank")
SCALING_COLUMNS = ("baseline_tokens_per_s", "scaling_efficiency_pct")
AGGREGATE_RANK = "all"
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class RankInfo:
    """Who this process is in its torchrun job."""

    rank: int
    world_size: int
    local_rank: int


def torchrun_rank() -> RankInfo:
    """This process's place in its torchrun job, from the variables torchrun sets; a user error outside one."""
    missing = [name for name in TORCHRUN_VARIABLES if name not in os.environ]
    if missing:
        raise ProfilerKitError(
            f"--parallel runs one rank per device under torchrun, e.g. `torchrun --nproc-per-node 2 -m profiler_kit "
            f"benchmark --parallel ddp ...`; this process has no {', '.join(missing)}"
        )
    return RankInfo(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"]))


def check_mode(parallel: str) -> None:
    if parallel not in PARALLEL_MODES:
        raise ProfilerKitError(f"unknown parallel mode {parallel!r}; choose from {', '.join(PARALLEL_MODES)}")


def join(device: torch.device) -> tuple[torch.device, RankInfo]:
    """This rank's device (cuda:LOCAL_RANK on GPUs, the CPU otherwise) and place, the process group opened on
    the first call: NCCL on GPUs, gloo on CPUs."""
    info = torchrun_rank()
    if device.type == "cuda":
        if info.local_rank >= torch.cuda.device_count():
            raise ProfilerKitError(
                f"local rank {info.local_rank} has no GPU: torch sees {torch.cuda.device_count()}; start at most "
                "that many ranks per node"
            )
        device = torch.device("cuda", info.local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        # torch.distributed.nn.functional binds the world group as its functions' default argument when first
        # imported (DDP imports it); imported after the group opens, it keeps the group alive past
        # destroy_process_group, and gloo's worker threads then release tensors during interpreter shutdown,
        # which aborts the process. Imported before, it binds None.
        importlib.import_module("torch.distributed.nn.functional")
        if device.type == "cuda":
            dist.init_process_group("nccl", device_id=device)
        else:
            dist.init_process_group("gloo")
    return device, info


def leave() -> None:
    """Close the process group, if this process opened one."""
    if dist.is_initialized():
        dist.destroy_process_group()


def wrap(model: nn.Module, parallel: str, device: torch.device, mixed_precision: bool = False) -> nn.Module:
    """`model` data-parallel over the open process group: DDP around it, or FSDP2 sharding each block's
    parameters and then the rest (embedding, final norm, LM head) at the root. With `mixed_precision`, FSDP2
    gathers the parameters in bf16 for the forward and backward and reduces the gradients in fp32
    (`MixedPrecisionPolicy`), as bf16 training with FSDP2 is run: gathering fp32 weights for bf16 autocast moves
    twice the bytes."""
    check_mode(parallel)
    if parallel == "ddp":
        return nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if parallel == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed_precision \
            else MixedPrecisionPolicy()
        for layer in model.layers:
            fully_shard(layer, mp_policy=policy)
        return fully_shard(model, mp_policy=policy)
    raise ProfilerKitError("parallel mode 'none' has no wrapper")


def gather_rows(row: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's row on rank 0, in rank order; an empty list elsewhere."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    rows: list[dict[str, Any]] | None = [{} for _ in range(world_size)] if rank == 0 else None
    dist.gather_object(row, rows, dst=0)
    return rows or []


def run_config(cfg: WorkloadConfig, run: Callable[[], dict[str, Any]],
               baseline_tokens_per_s: float | None = None) -> list[dict[str, Any]]:
    """`run()` (one benchmark row of `cfg`) on every rank; on rank 0 the per-rank rows and the aggregate row,
    each with its scaling efficiency when a baseline is given; an empty list on the other ranks."""
    info = torchrun_rank()
    row = {**run(), "parallel": cfg.parallel, "world_size": info.world_size, "rank": info.rank}
    rows = gather_rows(row)
    if not rows:
        return []
    rows.append(aggregate_row(rows, cfg.batch_size * cfg.ctx, cfg.mixed_precision))
    return [with_scaling(r, baseline_tokens_per_s) for r in rows]


def aggregate_row(rank_rows: Sequence[dict[str, Any]], tokens_per_rank_step: int, mixed_precision: bool) -> dict:
    """The job as a whole: the ranks step together, so each time column is the slowest rank's, the throughput is
    the global batch's tokens over the slowest rank's mean step time, and memory is the largest rank's."""
    first = rank_rows[0]
    world_size = len(rank_rows)
    out = {**first, "rank": AGGREGATE_RANK, "world_size": world_size}
    failed = [r for r in rank_rows if r.get("status") != "ok"]
    if failed:
        out.update(status=failed[0]["status"],
                   message=f"rank {failed[0]['rank']}: {failed[0].get('message', '')}")
        for column in (*_numeric_columns(first), "tokens_per_s", "model_tflops", "mfu_pct"):
            out[column] = None
        return out
    for column in _numeric_columns(first):
        values = [r[column] for r in rank_rows if r.get(column) is not None]
        out[column] = max(values) if values else None
    slowest = max(rank_rows, key=lambda r: r["total_ms"])
    seconds = slowest["total_ms"] / 1e3
    out["tokens_per_s"] = world_size * tokens_per_rank_step / seconds
    # Every rank does the same FLOPs per step: the job's rate is world_size × one rank's at the slowest time.
    flops_per_rank = first["model_tflops"] * first["total_ms"] / 1e3 * 1e12
    out["model_tflops"] = world_size * flops_per_rank / seconds / 1e12
    out["mfu_pct"] = mfu_pct(out["model_tflops"] / world_size, first.get("device"), mixed_precision)
    out["message"] = f"slowest rank {slowest['rank']}"
    return out


def _numeric_columns(row: dict[str, Any]) -> list[str]:
    """Time (`*_ms*`) and memory (`*_mib`) columns of a benchmark row."""
    return [c for c in row if "_ms" in c or c.endswith("_mib")]


def with_scaling(row: dict[str, Any], baseline_tokens_per_s: float | None) -> dict[str, Any]:
    """`row` with the baseline's tokens/s and the scaling efficiency in percent: tokens/s over the baseline's,
    times world_size on the aggregate row."""
    per_device = row.get("tokens_per_s")
    if baseline_tokens_per_s is None or per_device is None:
        return {**row, "baseline_tokens_per_s": baseline_tokens_per_s, "scaling_efficiency_pct": None}
    devices = row["world_size"] if row["rank"] == AGGREGATE_RANK else 1
    efficiency = per_device / (devices * baseline_tokens_per_s) * 100
    return {**row, "baseline_tokens_per_s": baseline_tokens_per_s, "scaling_efficiency_pct": efficiency}


def baseline_for(cfg: WorkloadConfig, rows: Iterable[dict[str, Any]], key_columns: Sequence[str]) -> float | None:
    """The single-device tokens/s of `cfg` among benchmark `rows`: the mean over its `ok` rows run without
    --parallel whose `key_columns` match; None when there is none."""
    want = cfg.as_dict()
    matches = [
        float(r["tokens_per_s"]) for r in rows
        if r.get("status") == "ok" and r.get("parallel", "none") in (None, "none") and r.get("tokens_per_s")
        and all(str(r.get(k)) == str(want[k]) for k in key_columns if k in want)
    ]
    return statistics.fmean(matches) if matches else None


def columns(benchmark_columns: Sequence[str]) -> list[str]:
    """The benchmark's columns with the rank columns before `device` and the scaling columns after `mfu_pct`."""
    out = list(benchmark_columns)
    out[out.index("device"):out.index("device")] = RANK_COLUMNS
    after = out.index("mfu_pct") + 1
    out[after:after] = SCALING_COLUMNS
    return out
