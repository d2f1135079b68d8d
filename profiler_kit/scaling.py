"""The rows of a data-parallel benchmark under torchrun: `run_config` benchmarks one config on every rank and
gathers the rows to rank 0 (`distributed.gather_rows`), which adds an aggregate row: the global batch's tokens
over the slowest rank's step time. Scaling efficiency compares throughput with a single-device baseline row of
the same config: a rank's tokens/s over the baseline's, and the aggregate's over world_size × the baseline's.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from profiler_kit.distributed import gather_rows, torchrun_rank
from profiler_kit.flops import mfu_pct
from profiler_kit.workload import WorkloadConfig

# Columns a data-parallel row adds to a benchmark row; `rank` is "all" on the aggregate row.
RANK_COLUMNS = ("parallel", "world_size", "rank")
SCALING_COLUMNS = ("baseline_tokens_per_s", "scaling_efficiency_pct")
AGGREGATE_RANK = "all"


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
