"""`profiler-kit benchmark`."""

from __future__ import annotations

import sys
from dataclasses import replace
from functools import partial
from pathlib import Path

import click
import pandas as pd

from profiler_kit import benchmark as bench
from profiler_kit import distributed
from profiler_kit.cli.common import format_option, non_negative_int, positive_int, workload_options
from profiler_kit.cli.parallel import baseline_option, emit_rank_rows, parallel_option, run_ranks
from profiler_kit.cli.sweep import run_with_progress
from profiler_kit.render import console_err, emit_tables, records
from profiler_kit.results_io import RowWriter
from profiler_kit.workload import WorkloadConfig

DISPLAY_COLUMNS = [
    "model",
    "ctx",
    "mode",
    "mixed_precision",
    "compile",
    "cuda_graphs",
    "attention",
    "optimizer",
    "repeat",
    "status",
    "warmup",
    "forward_ms",
    "backward_ms",
    "optimizer_ms",
    "total_ms",
    "total_ms_std",
    "total_ms_median",
    "total_ms_p10",
    "total_ms_p90",
    "host_cpu_ms",
    "tokens_per_s",
    "mfu_pct",
    "peak_allocated_mib",
]


@click.command("benchmark")
@workload_options(sweep=True)
@click.option(
    "--warmup", type=non_negative_int, default=5, show_default=True, help="Untimed steps per config, at least."
)
@click.option(
    "--max-warmup",
    type=non_negative_int,
    default=50,
    show_default=True,
    help="Untimed steps per config, at most: past --warmup, warm-up goes on until the step time settles (the median "
    f"of the last {bench.STABLE_WINDOW} steps within --stable-pct of the {bench.STABLE_WINDOW} before). At most "
    "--warmup: a fixed count.",
)
@click.option(
    "--stable-pct",
    type=click.FloatRange(min=0, min_open=True),
    default=2.0,
    show_default=True,
    help="How close two successive warm-up windows must be for the step time to count as settled.",
)
@click.option("--steps", type=positive_int, default=10, show_default=True, help="Timed steps per config.")
@click.option(
    "--cpu-threads",
    type=positive_int,
    default=None,
    help="torch's intra-op threads while a config runs [default: torch's, one per core]. On a CPU shared with "
    "other processes, 1 keeps a preempted thread from stalling every op.",
)
@click.option(
    "--repeat",
    type=positive_int,
    default=1,
    show_default=True,
    help="Run the whole sweep this many times, one pass after another (configs interleaved), one row per run; "
    "a table shows each config's spread across the passes.",
)
@click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Append one row per config as it finishes (.jsonl, .csv or .md).",
)
@click.option("--resume", is_flag=True, help="Skip configs already in --output.")
@parallel_option
@baseline_option
@format_option()
def benchmark_cmd(
    model,
    ctx,
    mode,
    batch_size,
    mixed_precision,
    compile_,
    cuda_graphs,
    attention,
    device,
    seed,
    nvtx,
    optimizer,
    warmup,
    max_warmup,
    stable_pct,
    steps,
    cpu_threads,
    repeat,
    output,
    resume,
    parallel,
    baseline,
    fmt,
) -> None:
    """Time forward, backward and optimizer phases over a sweep of model × ctx × mode × attention × optimizer."""
    base = WorkloadConfig(
        model[0], ctx[0], mode[0], batch_size, mixed_precision, compile_, attention[0], device, seed, nvtx,
        optimizer[0], parallel=parallel, cuda_graphs=cuda_graphs,
    )
    timing = bench.TimingOptions(warmup, max(warmup, max_warmup), steps, stable_pct, cpu_threads)
    items = bench.sweep_items(bench.sweep_configs(base, model, ctx, mode, attention, optimizer), repeat)
    if parallel != "none":
        _benchmark_ranks(items, replace(timing, max_warmup=warmup), baseline, output, resume, fmt)
        return
    if baseline is not None:
        raise click.UsageError("--baseline goes with --parallel (it is the single-device throughput)")
    writer = RowWriter(output, bench.COLUMNS, (*bench.KEY_COLUMNS, *bench.SETTING_COLUMNS)) if output else None

    def describe(group: list[bench.SweepItem]) -> str:
        cfg = group[0].cfg
        again = f" (pass {group[0].repeat}/{repeat})" if repeat > 1 else ""
        return f"{cfg.model} ctx={cfg.ctx} {cfg.mode} {cfg.attention} {cfg.optimizer}{again}"

    rows = run_with_progress(
        items,
        lambda group, status: [bench.run_config(group[0], timing, status)],
        key_columns=bench.KEY_COLUMNS,
        writer=writer,
        resume=resume,
        fmt=fmt,
        title="benchmark",
        describe=describe,
        label=lambda row: f"{row['model']} ctx={row['ctx']} {row['mode']}",
        settings=bench.settings(base, timing),
    )
    df = pd.DataFrame(rows, columns=list(bench.COLUMNS))
    if fmt == "json":
        emit_tables([("benchmark", df)], fmt, json_obj=records(df))
    elif fmt == "csv":
        emit_tables([("benchmark", df)], fmt)
    else:
        settle = f"-{timing.max_warmup} (until the step time settles)" if timing.max_warmup > warmup else ""
        caption = (
            f"{steps} timed steps after {warmup}{settle} warm-up steps; times in ms, mean unless marked; "
            f"device {df['device'].iloc[0]}"
        )
        tables = [("benchmark", df[DISPLAY_COLUMNS])]
        if repeat > 1:
            tables.append((f"across {repeat} passes (median step times)", bench.across_repeats(df)))
        emit_tables(tables, fmt, caption=caption)
    if writer:
        writer.check_all_written(lambda line: click.echo(line, err=True))
    failed = df[df["status"] == "error"]
    if len(failed):
        console_err.print(f"[red]{len(failed)} of {len(df)} configs failed with errors")
        sys.exit(1)


def _benchmark_ranks(items: list[bench.SweepItem], timing: bench.TimingOptions, baseline: Path | None,
                     output: Path | None, resume: bool, fmt: str) -> None:
    """The sweep under torchrun, each config on every rank, with a fixed warm-up (every rank must run as many
    steps); rank 0 renders the rows."""
    if resume:
        raise click.UsageError("--resume does not go with --parallel")
    columns = distributed.columns(bench.COLUMNS)
    jobs = [(item.cfg, partial(bench.run_config, item, timing)) for item in items]
    rows = run_ranks(jobs, baseline, output, bench.CONFIG_COLUMNS, columns)
    if rows is not None:
        caption = (f"{timing.steps} timed steps after {timing.warmup} warm-up on each rank; times in ms, mean unless "
                   "marked, the slowest rank's on the aggregate row (rank all)")
        emit_rank_rows(rows, columns, DISPLAY_COLUMNS, fmt, caption)


COMMANDS = [benchmark_cmd]
