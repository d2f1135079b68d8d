"""`--parallel ddp|fsdp` of `benchmark` and `nsys`: the built-in workload data-parallel, one process per rank,
started by torchrun (`torchrun --nproc-per-node N -m profiler_kit benchmark --parallel ddp ...`). Every rank
runs the configs; rank 0 alone prints and writes."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from profiler_kit.names import PARALLEL_MODES

if TYPE_CHECKING:
    import pandas as pd

    from profiler_kit.render import Shown
    from profiler_kit.workload import WorkloadConfig

RANK_DISPLAY_COLUMNS = ["parallel", "world_size", "rank"]


def parallel_option(fn: Callable) -> Callable:
    return click.option(
        "--parallel", type=click.Choice(PARALLEL_MODES), default="none", show_default=True,
        help="Data-parallel under torchrun, one rank per GPU: ddp (DistributedDataParallel) or fsdp (FSDP2 "
             "fully_shard); start it with `torchrun --nproc-per-node N -m profiler_kit ...`.",
    )(fn)


def baseline_option(fn: Callable) -> Callable:
    return click.option(
        "--baseline", type=click.Path(dir_okay=False, exists=True, readable=False, path_type=Path),
        help="With --parallel: benchmark rows (.jsonl, .csv, .md) of the same configs on one device without "
             "--parallel; each row's scaling efficiency is its tokens/s over theirs (× world size for the "
             "aggregate row).",
    )(fn)


def run_ranks(jobs: Sequence[tuple[WorkloadConfig, Callable[[], dict[str, Any]]]], baseline: Path | None,
              output: Path | None, key_columns: Sequence[str], columns: Sequence[str]) -> list[dict[str, Any]] | None:
    """Each job, a config and the call that benchmarks it, on every rank of this torchrun job. Rank 0 gets the
    rows (each job's per-rank rows and its aggregate row) and appends them to `output` as they come, failing at
    the end if some could not be written; the other ranks get None. `key_columns` match a config to its rows in
    the `baseline` file."""
    from profiler_kit import distributed, scaling
    from profiler_kit.device import resolve_device
    from profiler_kit.render import say
    from profiler_kit.results_io import RowWriter, read_rows

    _, place = distributed.join(resolve_device(jobs[0][0].device))
    try:
        lead = place.rank == 0
        baseline_rows = read_rows(baseline) if baseline and lead else []
        writer = RowWriter(output, columns, (*key_columns, *scaling.RANK_COLUMNS)) if output and lead else None
        rows: list[dict[str, Any]] = []
        for cfg, run in jobs:
            if lead:
                say(f"{cfg.model} ctx={cfg.ctx} {cfg.mode}: {cfg.parallel} on {place.world_size} rank(s)")
            base = scaling.baseline_for(cfg, baseline_rows, key_columns) if lead else None
            new = scaling.run_config(cfg, run, base)
            for row in new:
                if writer:
                    writer.append(row)
                if row["status"] != "ok":
                    say(f"{cfg.model} ctx={cfg.ctx} {cfg.mode} rank {row['rank']}: {row['status']}: {row['message']}")
            if lead and baseline and new and new[-1]["baseline_tokens_per_s"] is None:
                say(f"{cfg.model} ctx={cfg.ctx} {cfg.mode}: no ok row of this config without --parallel in "
                    f"{baseline}: no scaling efficiency")
            rows += new
        if writer:
            writer.check_all_written(lambda line: click.echo(line, err=True))
    finally:
        distributed.leave()
    return rows if lead else None


def emit_rank_rows(rows: list[dict[str, Any]], columns: Sequence[str], display: Callable[[pd.DataFrame], Shown],
                   fmt: str, caption: str) -> None:
    """Rank 0's table (`display`'s default columns and the rank columns) or document (every column); exit 1 on
    errors."""
    import pandas as pd

    from profiler_kit.render import Shown, emit_tables, records, say

    df = pd.DataFrame(rows, columns=list(columns))
    view = display(df)
    shown = list(view.default)
    shown[shown.index("status"):shown.index("status")] = RANK_DISPLAY_COLUMNS
    shown.append("scaling_efficiency_pct")
    view = Shown(view.frame, shown) if fmt in ("table", "markdown") else df  # machines get the rows as measured
    emit_tables([("benchmark", view)], fmt, json_obj={"results": records(df)} if fmt == "json" else None,
                caption=caption)
    failed = df[df["status"] == "error"]
    if len(failed):
        say(f"{len(failed)} of {len(df)} rows failed with errors")
        sys.exit(1)
