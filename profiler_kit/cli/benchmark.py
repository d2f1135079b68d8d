"""`profiler-kit benchmark`."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import pandas as pd
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from profiler_kit import benchmark as bench
from profiler_kit.cli.common import format_option, non_negative_int, positive_int, workload_options
from profiler_kit.render import console_err, emit_tables, records
from profiler_kit.results_io import RowWriter, pending, read_rows, rows_of, run_sweep
from profiler_kit.workload import WorkloadConfig, resolve_device

DISPLAY_COLUMNS = [
    "model",
    "ctx",
    "mode",
    "mixed_precision",
    "compile",
    "status",
    "forward_ms",
    "backward_ms",
    "optimizer_ms",
    "total_ms",
    "total_ms_std",
    "tokens_per_s",
    "model_tflops",
    "mfu_pct",
    "peak_allocated_mb",
]


@click.command("benchmark")
@workload_options(sweep=True)
@click.option(
    "--warmup", type=non_negative_int, default=5, show_default=True, help="Untimed steps per config."
)
@click.option("--steps", type=positive_int, default=10, show_default=True, help="Timed steps per config.")
@click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Append one row per config as it finishes (.jsonl, .csv or .md).",
)
@click.option("--resume", is_flag=True, help="Skip configs already in --output.")
@format_option()
def benchmark_cmd(
    model,
    ctx,
    mode,
    batch_size,
    mixed_precision,
    compile_,
    attention,
    device,
    seed,
    nvtx,
    warmup,
    steps,
    output,
    resume,
    fmt,
) -> None:
    """Time forward, backward and optimizer phases over a sweep of model × ctx × mode."""
    if resume and output is None:
        raise click.UsageError("--resume needs --output (the file whose rows are skipped)")
    base = WorkloadConfig(
        model[0], ctx[0], mode[0], batch_size, mixed_precision, compile_, attention, device, seed, nvtx
    )
    settings = {"steps": steps, "warmup": warmup, "device": bench.device_label(resolve_device(device))}
    configs = bench.sweep_configs(base, model, ctx, mode)
    writer = RowWriter(output, bench.COLUMNS) if output else None
    done = read_rows(output) if resume else []
    todo = pending(configs, done, bench.KEY_COLUMNS, settings) if resume else configs
    if resume and len(todo) < len(configs):
        console_err.print(f"resume: {len(configs) - len(todo)} of {len(configs)} configs already in {output}")
    rows = rows_of(configs, done, bench.KEY_COLUMNS, settings)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console_err,
        transient=fmt != "table",
    ) as progress:
        task = progress.add_task("benchmark", total=len(todo))

        def on_start(cfg: WorkloadConfig) -> None:
            progress.update(task, description=f"{cfg.model} ctx={cfg.ctx} {cfg.mode}")

        def on_row(row: dict) -> None:
            if writer:
                writer.append(row)
            if row["status"] != "ok":
                progress.console.print(
                    f"[yellow]{row['model']} ctx={row['ctx']} {row['mode']}: "
                    f"{row['status']}: {row['message']}"
                )
            progress.advance(task)

        rows += list(run_sweep(todo, lambda cfg: bench.run_config(cfg, warmup, steps), on_start, on_row))
    df = pd.DataFrame(rows, columns=list(bench.COLUMNS))
    if fmt == "json":
        emit_tables([("benchmark", df)], fmt, json_obj=records(df))
    elif fmt == "csv":
        emit_tables([("benchmark", df)], fmt)
    else:
        caption = f"{steps} timed steps after {warmup} warm-up; times are means in ms; device {df['device'].iloc[0]}"
        emit_tables([("benchmark", df[DISPLAY_COLUMNS])], fmt, caption=caption)
    if writer:
        writer.check_all_written(lambda line: click.echo(line, err=True))
    failed = df[df["status"] == "error"]
    if len(failed):
        console_err.print(f"[red]{len(failed)} of {len(df)} configs failed with errors")
        sys.exit(1)


COMMANDS = [benchmark_cmd]
