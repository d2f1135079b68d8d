"""`profiler-kit benchmark`."""

from __future__ import annotations

import sys
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import click

from profiler_kit.cli.common import format_option, non_negative_int, positive_float, positive_int, workload_options
from profiler_kit.cli.parallel import baseline_option, parallel_option
from profiler_kit.defaults import STABLE_WINDOW
from profiler_kit.names import OPTIMIZERS

if TYPE_CHECKING:
    import pandas as pd

    from profiler_kit import benchmark as bench
    from profiler_kit.render import Shown

DISPLAY_COLUMNS = ["config", "status", "fwd_ms", "bwd_ms", "opt_ms", "step_ms", "spread_pct", "noisy", "mfu_pct",
                   "peak_MiB"]
# A row whose step time varies more than this (std / mean of the total) is flagged as not steady.
STEADY_SPREAD_PCT = 10.0


def _benchmark_column(name: str) -> bool:
    """Whether `name` may be a column of the benchmark's tables: a row's (with the ranks' columns of
    --parallel), a people's table's, or one of the table across --repeat passes (which carry units)."""
    from profiler_kit import benchmark as bench
    from profiler_kit import distributed
    from profiler_kit.names import UNIT_SUFFIXES

    return name in (*distributed.columns(bench.COLUMNS), *DISPLAY_COLUMNS, "repeats") or name.endswith(
        (*UNIT_SUFFIXES, "_min", "_max"))


def _config_label(row: pd.Series) -> str:
    """One config in a few words: model, ctx, mode, then what differs from the defaults."""
    import pandas as pd

    flags = [name for name, on in (("bf16", row["mixed_precision"]), ("compile", row["compile"]),
                                   ("graphs", row["cuda_graphs"]), (row["attention"], row["attention"] != "naive"),
                                   (row["optimizer"], row["optimizer"] != OPTIMIZERS[0]),
                                   ("overlap", row.get("optimizer_overlap")),
                                   (f"clip{row.get('clip_grad_norm')}", pd.notna(row.get("clip_grad_norm")))) if on]
    again = [f"#{row['repeat']}"] if row.get("repeat", 1) not in (1, None) else []
    return " ".join(map(str, [row["model"], f"ctx{row['ctx']}", row["mode"], *flags, *again]))


def display_rows(df: pd.DataFrame) -> Shown:
    """The benchmark rows for people: the config in one column, median phase and step times, the step time's
    spread (std / mean) and whether it is over STEADY_SPREAD_PCT (noisy), MFU and peak memory; --wide shows every
    column."""
    import pandas as pd

    from profiler_kit.render import Shown

    shown = df.assign(
        config=df.apply(_config_label, axis=1) if len(df) else pd.Series(dtype=str),
        fwd_ms=df["forward_ms_median"], bwd_ms=df["backward_ms_median"], opt_ms=df["optimizer_ms_median"],
        step_ms=df["total_ms_median"], spread_pct=df["total_ms_std"] / df["total_ms"] * 100,
        peak_MiB=df["peak_allocated_mib"],
    )
    shown["noisy"] = shown["spread_pct"].map(lambda v: None if pd.isna(v) else bool(v > STEADY_SPREAD_PCT))
    return Shown(shown, DISPLAY_COLUMNS)


def _people_tables(df: pd.DataFrame, repeat: int) -> list[tuple[str, pd.DataFrame | Shown]]:
    """The benchmark table for people, and with --repeat the spread of each config across the passes."""
    from profiler_kit import benchmark as bench

    tables: list[tuple[str, pd.DataFrame | Shown]] = [("benchmark", display_rows(df))]
    if repeat > 1:
        tables.append((f"across {repeat} passes (median step times)", bench.across_repeats(df)))
    return tables


def unsteady_note(df: pd.DataFrame) -> str | None:
    """A note naming the rows whose step time spread is over STEADY_SPREAD_PCT, or None."""
    spread = df["total_ms_std"] / df["total_ms"] * 100
    noisy = df[spread > STEADY_SPREAD_PCT]
    if not len(noisy):
        return None
    return (f"{len(noisy)} of {len(df)} rows vary more than {STEADY_SPREAD_PCT:g}% (std / mean of the step): "
            "other load on the host, too few warm-up steps or CPU threads competing; their times are not steady")


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
    f"of the last {STABLE_WINDOW} steps within --stable-pct of the {STABLE_WINDOW} before). At most "
    "--warmup: a fixed count.",
)
@click.option(
    "--stable-pct",
    type=positive_float,
    default=2.0,
    show_default=True,
    help="How close two successive warm-up windows must be for the step time to count as settled.",
)
@click.option("--steps", type=positive_int, default=10, show_default=True, help="Timed steps per config.")
@click.option(
    "--optimizer-overlap",
    is_flag=True,
    help="Train: update each block's parameters as soon as its gradients are final, on a stream of its own beside "
    "the backward of the blocks before it (--compile then compiles block by block; --cuda-graphs captures the "
    "whole step as one graph). opt_exposed_ms: how much longer the step is than its backward.",
)
@click.option(
    "--clip-grad-norm",
    type=positive_float,
    default=None,
    help="Train: clip the gradients' total norm to this before the update (which then waits for the whole "
    "backward, with --optimizer-overlap too: the row says so).",
)
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
@format_option(tables=("benchmark",), columns=_benchmark_column)
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
    memory_limit_gib,
    nvtx,
    optimizer,
    warmup,
    max_warmup,
    stable_pct,
    steps,
    optimizer_overlap,
    clip_grad_norm,
    cpu_threads,
    repeat,
    output,
    resume,
    parallel,
    baseline,
    fmt,
) -> None:
    """Time forward, backward and optimizer phases over a sweep of model × ctx × mode × attention × optimizer."""
    import pandas as pd

    from profiler_kit import benchmark as bench
    from profiler_kit.cli.sweep import run_with_progress
    from profiler_kit.render import emit_tables, records, say
    from profiler_kit.results_io import RowWriter
    from profiler_kit.workload import WorkloadConfig

    base = WorkloadConfig(
        model[0], ctx[0], mode[0], batch_size, mixed_precision, compile_, attention[0], device, seed, nvtx,
        optimizer[0], parallel=parallel, cuda_graphs=cuda_graphs, optimizer_overlap=optimizer_overlap,
        clip_grad_norm=clip_grad_norm, memory_limit_gib=memory_limit_gib,
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
    note = unsteady_note(df)
    if fmt == "table":
        settle = f"-{timing.max_warmup} (until the step time settles)" if timing.max_warmup > warmup else ""
        caption = (
            f"{steps} timed steps after {warmup}{settle} warm-up steps; medians in ms; spread_pct: std / mean of "
            f"the step time (noisy above {STEADY_SPREAD_PCT:g}%); device {df['device'].iloc[0]}"
            + (f"\nnote: {note}" if note else "")
        )
        emit_tables(_people_tables(df, repeat), fmt, caption=caption)
    elif fmt == "markdown":
        if note:
            say(f"note: {note}")
        emit_tables(_people_tables(df, repeat), fmt)
    else:
        if note:
            say(f"note: {note}")
        emit_tables([("benchmark", df)], fmt, json_obj={"results": records(df)})  # the rows as measured
    if writer:
        writer.check_all_written(lambda line: click.echo(line, err=True))
    failed = df[df["status"] == "error"]
    if len(failed):
        say(f"{len(failed)} of {len(df)} configs failed with errors")
        sys.exit(1)


def _benchmark_ranks(items: list[bench.SweepItem], timing: bench.TimingOptions, baseline: Path | None,
                     output: Path | None, resume: bool, fmt: str) -> None:
    """The sweep under torchrun, each config on every rank, with a fixed warm-up (every rank must run as many
    steps); rank 0 renders the rows."""
    from profiler_kit import benchmark as bench
    from profiler_kit import scaling
    from profiler_kit.cli.parallel import emit_rank_rows, run_ranks

    if resume:
        raise click.UsageError("--resume does not go with --parallel")
    columns = scaling.columns(bench.COLUMNS)
    jobs = [(item.cfg, partial(bench.run_config, item, timing)) for item in items]
    rows = run_ranks(jobs, baseline, output, bench.CONFIG_COLUMNS, columns)
    if rows is not None:
        caption = (f"{timing.steps} timed steps after {timing.warmup} warm-up on each rank; times in ms, mean unless "
                   "marked, the slowest rank's on the aggregate row (rank all)")
        emit_rank_rows(rows, columns, display_rows, fmt, caption)


COMMANDS = [benchmark_cmd]
