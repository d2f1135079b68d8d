"""`profiler-kit attention bench` and `profiler-kit attention leaderboard`.

The benchmark library (and through it the attention kernels and Triton), torch and pandas are imported only when
one of these commands runs, so that the rest of the command line and `--help` neither wait for nor depend on
them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from profiler_kit.cli.common import comma_list, format_option, non_negative_int, one_of, positive_int, single
from profiler_kit.errors import ProfilerKitError

if TYPE_CHECKING:
    import pandas as pd

KEY_VIEW = ["impl", "dtype", "seq", "d", "status"]
TIMING_VIEW = [*KEY_VIEW, "fwd_ms", "bwd_ms", "fwd_bwd_ms", "fwd_bwd_p20_ms", "fwd_bwd_p80_ms",
               "fwd_tflops", "bwd_tflops", "fwd_bwd_tflops"]
MEMORY_VIEW = [*KEY_VIEW, "mem_inputs_mib", "mem_before_bwd_mib", "saved_mib", "saved_analytic_mib",
               "fwd_peak_mib", "bwd_peak_mib", "message"]
LEADERBOARD_IMPLS = "flash-triton,sdpa-flash,sdpa-cudnn,sdpa-efficient"


def impl_names() -> tuple[str, ...]:
    """The implementation names (`profiler_kit.attention.registry`)."""
    from profiler_kit.attention.registry import NAMES

    return NAMES


def dtype_names() -> tuple[str, ...]:
    from profiler_kit.attention.registry import DTYPES

    return DTYPES


def _attention_column(name: str) -> bool:
    """Whether `name` may be a column of the attention tables: a result's, an implementation's (the pivot
    tables), or a speedup of one over another (`flash-triton_vs_sdpa-flash`)."""
    from profiler_kit.attention.bench import COLUMNS

    return name in (*COLUMNS, *impl_names()) or "_vs_" in name


def _run_options(table: str) -> Callable:
    """Options shared by both commands: device, do_bench budget, result file, output format (whose CSV prints
    the one table `table`)."""
    options = [
        click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto",
                     show_default=True),
        click.option("--warmup", type=non_negative_int, default=25, show_default=True,
                     help="Warm-up time per measurement in ms (do_bench's warmup)."),
        click.option("--rep", type=positive_int, default=100, show_default=True,
                     help="Measured time per measurement in ms (do_bench's rep)."),
        click.option("--rounds", type=positive_int, default=1, show_default=True,
                     help="Time each shape's implementations together in this many rounds, their order "
                          "alternating, each round measuring rep/rounds ms; medians pool the rounds' calls. "
                          "Use it on host-bound shapes, where one reading moves with the host's state."),
        click.option("--backward-on-caller", is_flag=True,
                     help="Run every implementation's backward on the calling thread instead of the autograd "
                          "engine's CUDA device thread (torch.autograd.set_multithreading_enabled(False)): takes "
                          "the engine's thread switches, most of a host-bound call's time, out of the readings."),
        click.option("--output", type=click.Path(dir_okay=False, path_type=Path),
                     help="Append one row per config as soon as it finishes, with --rounds a shape's rows "
                          "after its last round (.jsonl, .csv or .md)."),
        click.option("--resume", is_flag=True, help="Skip configs already in --output (and show them)."),
        format_option(tables=(table,), columns=_attention_column),
    ]

    def decorate(fn: Callable) -> Callable:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return decorate


def _measure(configs: list, warmup: int, rep: int, rounds: int, backward_on_caller: bool, output: Path | None,
             resume: bool, fmt: str) -> pd.DataFrame:
    """Run the configs not yet in --output (all of them without --resume), appending each row as it comes; with
    several rounds, a shape's implementations run together and their rows come together."""
    import pandas as pd

    from profiler_kit.attention import bench
    from profiler_kit.cli.sweep import run_with_progress
    from profiler_kit.device import resolve_device
    from profiler_kit.results_io import RowWriter

    writer = RowWriter(output, bench.COLUMNS, (*bench.KEY_COLUMNS, *bench.SETTING_COLUMNS)) if output else None

    def describe(group: list) -> str:
        cfg = group[0]
        what = ",".join(c.impl for c in group) + (f" ×{rounds} rounds" if rounds > 1 else "")
        return f"{what} {cfg.dtype} seq={cfg.seq} d={cfg.d}"

    rows = run_with_progress(
        configs, lambda group, status: bench.run_shape(group, warmup, rep, rounds, backward_on_caller),
        key_columns=bench.KEY_COLUMNS, writer=writer, resume=resume, fmt=fmt,
        title="attention", describe=describe,
        label=lambda row: f"{row['impl']} {row['dtype']} seq={row['seq']} d={row['d']}",
        groups=lambda todo: bench.shape_groups(todo, together=rounds > 1),
        settings=bench.settings(resolve_device(configs[0].device), warmup, rep, rounds, backward_on_caller))
    if writer:
        writer.check_all_written(lambda line: click.echo(line, err=True))
    return pd.DataFrame(rows, columns=list(bench.COLUMNS))


def _caption(results: pd.DataFrame, warmup: int, rep: int, rounds: int, backward_on_caller: bool) -> str:
    import pandas as pd

    first = results.iloc[0]
    heads = "no heads" if pd.isna(first["heads"]) else f"{int(first['heads'])} heads"
    interleaved = f", {rounds} interleaved rounds per shape" if rounds > 1 else ""
    caller = ", backward on the calling thread" if backward_on_caller else ""
    return (f"batch {first['batch']}, {heads}, {'causal' if first['causal'] else 'non-causal'}, "
            f"device {first['device']}; medians (do_bench on CUDA, host clock elsewhere; warmup {warmup} ms, "
            f"rep {rep} ms{interleaved}{caller}); "
            "memory in MiB allocated; speedups are ref_ms / impl_ms")


def _exit_if_nothing_ran(results: pd.DataFrame) -> None:
    """Configs an implementation cannot run are expected (an SDPA backend and fp32); none running is not."""
    if not (results["status"] == "ok").any():
        from profiler_kit.render import say

        say("no config ran: every row is an error or an OOM (see the message column)")
        sys.exit(1)


@click.group("attention")
def attention() -> None:
    """Attention implementations side by side: time, TFLOP/s and memory."""


@attention.command("bench")
@click.option("--impl", "impls", callback=comma_list(one_of(impl_names)),
              help="Implementations, comma list (default: naive, compiled, sdpa-flash, sdpa-cudnn, "
                   "sdpa-efficient, flash-torch, flash-triton; also sdpa and flash).")
@click.option("--batch", type=positive_int, default=8, show_default=True)
@click.option("--heads", type=positive_int, default=None,
              help="Heads; without it inputs have no head dimension: (batch, seq, d).")
@click.option("--d", "ds", default="16,32,64,128", show_default=True, callback=comma_list(positive_int),
              help="Head dims (comma list).")
@click.option("--seq", "seqs", default="256,1024,4096,8192,16384", show_default=True,
              callback=comma_list(positive_int), help="Sequence lengths (comma list).")
@click.option("--dtype", "dtypes", default="fp32,bf16", show_default=True, callback=comma_list(one_of(dtype_names)),
              help="fp32, bf16, fp16 (comma list).")
@click.option("--causal/--no-causal", default=True, show_default=True)
@_run_options("attention")
def bench_cmd(impls, batch, heads, ds, seqs, dtypes, causal, device, warmup, rep, rounds, backward_on_caller,
              output, resume, fmt) -> None:
    """Forward, backward and forward+backward of each implementation over dtype × d × seq."""
    from profiler_kit.attention import bench
    from profiler_kit.attention.bench_tables import pivot_tables
    from profiler_kit.render import emit_tables, records

    configs = bench.sweep_configs(impls or bench.DEFAULT_IMPLS, dtypes, ds, seqs, batch, heads, causal, device)
    results = _measure(configs, warmup, rep, rounds, backward_on_caller, output, resume, fmt)
    pivots = pivot_tables(results)
    if fmt == "json":
        emit_tables([], fmt, json_obj={"results": records(results),
                                       "pivots": {title: records(df) for title, df in pivots}})
    elif fmt == "csv":
        emit_tables([("attention", results)], fmt)
    else:
        emit_tables([("timings", results[TIMING_VIEW]), ("memory", results[MEMORY_VIEW]), *pivots], fmt,
                    caption=_caption(results, warmup, rep, rounds, backward_on_caller))
    _exit_if_nothing_ran(results)


@attention.command("leaderboard")
@click.option("--impl", "impls", default=LEADERBOARD_IMPLS, show_default=True,
              callback=comma_list(one_of(impl_names)))
@click.option("--batch", type=positive_int, default=1, show_default=True)
@click.option("--heads", type=positive_int, default=16, show_default=True)
@click.option("--seq", type=positive_int, default=16384, show_default=True)
@click.option("--d", type=positive_int, default=64, show_default=True, help="Head dim.")
@click.option("--dtype", default="bf16", show_default=True, callback=single(one_of(dtype_names)))
@click.option("--causal/--no-causal", default=True, show_default=True)
@_run_options("leaderboard")
def leaderboard_cmd(impls, batch, heads, seq, d, dtype, causal, device, warmup, rep, rounds, backward_on_caller,
                    output, resume, fmt) -> None:
    """Forward+backward of flash-triton against the SDPA backends on one config, fastest first."""
    from profiler_kit.attention import bench
    from profiler_kit.attention.bench_tables import leaderboard_table
    from profiler_kit.device import resolve_device
    from profiler_kit.render import emit_tables, records

    if device == "auto" and resolve_device(device).type != "cuda":
        raise ProfilerKitError("attention leaderboard races the SDPA CUDA backends and needs a CUDA GPU, which this "
                               "machine lacks; to run it on the CPU anyway, pass --device cpu and a small --seq")
    configs = bench.sweep_configs(impls, [dtype], [d], [seq], batch, heads, causal, device)
    results = _measure(configs, warmup, rep, rounds, backward_on_caller, output, resume, fmt)
    board = leaderboard_table(results)
    if fmt == "json":
        emit_tables([], fmt, json_obj={"leaderboard": records(board), "results": records(results)})
    else:
        mask = "causal" if causal else "non-causal"
        title = f"leaderboard: B={batch} H={heads} N={seq} d={d} {dtype} {mask}"
        emit_tables([(title, board)], fmt, caption=_caption(results, warmup, rep, rounds, backward_on_caller))
    _exit_if_nothing_ran(results)


COMMANDS = [attention]
