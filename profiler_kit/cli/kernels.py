"""`profiler-kit kernels summarize|compare|whatif|timeline`: where GPU time goes, from any kernel report."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from profiler_kit.cli.common import (
    FORCE,
    comma_list,
    format_option,
    non_negative_float,
    one_of,
    positive_float,
    positive_int,
)
from profiler_kit.defaults import DEFAULT_GATES, DEFAULT_MIN_DELTA_SHARE, KERNELS_TOP
from profiler_kit.names import COMPARE_TABLES, GATES, PHASE_RULE, SUMMARY_TABLES, WHATIF_TABLES, report_column

if TYPE_CHECKING:
    from profiler_kit.render import Report

SOURCES_HELP = (
    "A report is an nsys .nsys-rep or its .sqlite export, `nsys stats` cuda_gpu_kern_sum output (CSV or "
    "text table, any nsys version or --timeunit), or a torch.profiler Chrome trace (.json, .json.gz)."
)


def _analysis_options(tables: tuple[str, ...]) -> Callable:
    """The options summarize and compare share, in the order --help lists them; `tables`: those the command can
    print."""
    options = (
        click.option(
            "--top", type=positive_int, default=KERNELS_TOP, show_default=True, help="How many kernels to list."
        ),
        click.option(
            "--nvtx",
            metavar="RANGE",
            default=None,
            help="Only kernels launched inside NVTX ranges of this name, split by its sub-ranges.",
        ),
        click.option(
            "--phase",
            "phases",
            metavar="NAME",
            multiple=True,
            help=f"An NVTX range to report as a phase (repeatable). {PHASE_RULE}",
        ),
        format_option(tables=tables, columns=report_column),
        click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     metavar="FILE.png", help="Also draw the report's charts into this PNG."),
        click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     metavar="FILE.html", help="Also write the charts and tables as one self-contained HTML file "
                                               "(opens offline)."),
        FORCE,
    )

    def decorate(fn: Callable) -> Callable:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return decorate

# What-if replays GPU kernels on their streams: a CPU recording has no streams, launches or queues to replay.
GPU_SOURCES_HELP = (
    "GPU reports only: an nsys .nsys-rep or its .sqlite export, or a torch.profiler Chrome trace (.json, "
    ".json.gz) of a GPU run; a CPU trace is refused (`kernels summarize` gives each category's share of its "
    "time, the most a speedup of it could save)."
)

ONE_PROCESS_ONLY = "--nvtx and --flops-per-step take the report of one process"

# Several reports (ranks) are read this many at a time, each in a process of its own.
JOBS = click.option("-j", "--jobs", type=positive_int, default=1, show_default=True,
                    help="Read this many of several reports (ranks) at a time, each in a process of its own.")
SCHEDULER = click.option(
    "--scheduler", metavar="ADDRESS", default=None,
    help="Analyse several reports (ranks) on a Dask cluster: the address of its scheduler (tcp://host:8786; each "
         "worker reads the reports where they lie, so give paths every worker sees), or `local` for a cluster of "
         "-j worker processes here. Needs the `dask` extra.")
PER_RANK_DETAIL = click.option("--per-rank-detail", is_flag=True,
                               help="Several reports (ranks): each rank's whole summary in the JSON, not only its "
                                    "figures.")


def _write_pictures(report: Report, plot_path: Path | None, html_path: Path | None) -> None:
    """The report's charts (`kernels.charts`) as a PNG and as an HTML page, where asked."""
    if plot_path is None and html_path is None:
        return
    from profiler_kit.kernels.charts import report_charts
    from profiler_kit.render import say

    title, charts = report_charts(report)
    if plot_path is not None:
        from profiler_kit.kernels.plot import write_png

        say(f"wrote {write_png(charts, title, plot_path)}")
    if html_path is not None:
        from profiler_kit.kernels.html import write_html

        say(f"wrote {write_html(report, charts, title, html_path)}")


@click.group("kernels")
def kernels() -> None:
    """Kernel time by category (matmul, attention, elementwise, ...), per phase and per kernel."""


@kernels.command("summarize", epilog=SOURCES_HELP)
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path, readable=False))
@_analysis_options(SUMMARY_TABLES)
@click.option("--flops-per-step", type=positive_float, default=None, metavar="FLOPS",
              help="The model FLOPs of one step: TFLOP/s (and MFU with --peak-tflops) over the phases' GPU span.")
@click.option("--peak-tflops", type=positive_float, default=None,
              help="The GPU's peak TFLOP/s at the run's precision, for MFU.")
@JOBS
@SCHEDULER
@PER_RANK_DETAIL
def summarize_command(paths: tuple[Path, ...], top: int, nvtx: str | None, phases: tuple[str, ...], fmt: str,
                      plot_path: Path | None, html_path: Path | None, force: bool, flops_per_step: float | None,
                      peak_tflops: float | None, jobs: int, scheduler: str | None, per_rank_detail: bool) -> None:
    """Summarize the kernels of one report: by category, per kernel, per phase, and where the GPU idles in
    each phase (launch-bound when idle above half of the phase's GPU span; one long gap, such as start-up or
    autotuning, is named instead). A report whose phases sit in a repeating range (`step`, `ProfilerStep#N`)
    gets a per-step table, warm-up steps apart, and the idle verdicts come from the steady steps. A range
    outside the phases holding more than 5% of the time is named in a note.

    Several reports (or one that holds several processes) are the ranks of one job, each the RANK it had (else
    `.rank<R>.` in its name, else in the order given): over the steps no rank spent warming up, a table per rank,
    the merged categories, communication per phase (overlapped by compute elsewhere, and exposed), each phase's
    spread across ranks with its slowest rank, and per step the rank that entered the collectives last.

    --plot and --html draw each phase's time stacked by category and each step's wall time, kernel time and
    GPU idle share; for several ranks, a bar group per rank."""
    from profiler_kit.engine import Engine
    from profiler_kit.files import check_output_paths
    from profiler_kit.kernels import summarize_trace
    from profiler_kit.kernels.phase_metrics import FlopRate
    from profiler_kit.kernels.rank_rows import RowOptions
    from profiler_kit.kernels.ranks import RankedSummary, rank_traces, summarize_ranks, summarize_reports
    from profiler_kit.render import emit_report

    check_output_paths([plot_path, html_path], paths, force)
    one_process_only = nvtx is not None or flops_per_step is not None
    if len(paths) > 1 and one_process_only:  # before any report is read; a report may also hold several
        raise click.UsageError(ONE_PROCESS_ONLY)
    options = RowOptions(top, tuple(phases) or None, per_rank_detail)
    if len(paths) > 1:
        report = summarize_reports(list(paths), Engine(jobs, scheduler), options)
        ranks = []
    else:
        ranks = rank_traces(list(paths))
    if len(ranks) > 1:
        if one_process_only:
            raise click.UsageError(ONE_PROCESS_ONLY)
        report = summarize_ranks(ranks, options)
    elif ranks:
        report = summarize_trace(ranks[0][1], top=top, phases=list(phases) or None, nvtx=nvtx)
        if flops_per_step is not None:
            report = report.with_flops(FlopRate(per_step=flops_per_step, peak_tflops=peak_tflops))
    if isinstance(report, RankedSummary):
        report.every_rank = bool(getattr(fmt, "wide", False))
    _write_pictures(report, plot_path, html_path)
    emit_report(report, fmt)


class _CompareCommand(click.Command):
    """`--against B1 B2 ...` takes every report that follows it, up to the next option."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        out, against = [], False
        for arg in args:
            if arg == "--against":
                against = True
            elif arg.startswith("-"):
                against = False
                out.append(arg)
            else:
                out.extend(["--against", arg] if against else [arg])
        return super().parse_args(ctx, out)


@kernels.command("compare", cls=_CompareCommand, epilog=SOURCES_HELP)
@click.argument("reports", nargs=-1, type=click.Path(path_type=Path, readable=False))
@click.option("--against", "against", multiple=True, type=click.Path(path_type=Path, readable=False), metavar="B...",
              help="The reports of side B (several runs of the changed program); the reports before it are side A.")
@click.option("--baseline", type=click.Path(path_type=Path, readable=False), default=None, metavar="JSON",
              help="Side A from a saved JSON: the B side of an earlier `kernels compare --format json`, or a "
                   "`kernels summarize --format json`; the reports given are then side B.")
@_analysis_options(COMPARE_TABLES)
@click.option("--fail-above", "fail_above", type=non_negative_float, metavar="PCT", default=None,
              help="Exit 1 when a check of --gate regressed: B's median is above A's by more than both sides' "
                   "range over their runs, --min-delta-ms and PCT percent. The failure lists each failed check "
                   "with A, B and the kernels that moved most; the JSON's `gate` has every check.")
@click.option("--gate", "gates", default=",".join(DEFAULT_GATES), show_default=True,
              callback=comma_list(one_of(GATES)),
              help=f"What --fail-above checks (comma list of {', '.join(GATES)}): the total, each phase, each "
                   "category, each kernel both sides have.")
@click.option("--min-delta-ms", type=non_negative_float, default=None, metavar="MS",
              help="A check fails only when B is also this many ms above A "
                   f"[default: {DEFAULT_MIN_DELTA_SHARE:.0%} of A's total].")
@click.pass_context
def compare_command(ctx: click.Context, reports: tuple[Path, ...], against: tuple[Path, ...], baseline: Path | None,
                    top: int, nvtx: str | None, phases: tuple[str, ...], fmt: str, plot_path: Path | None,
                    html_path: Path | None, force: bool, fail_above: float | None, gates: list[str],
                    min_delta_ms: float | None) -> None:
    """Compare two reports, or two sides of runs: time per category, phase and kernel in A and B (medians over
    each side's runs: the steps of its reports when each has a per-step table, else the reports), delta (B − A),
    speedup (A / B). Kernels are matched by what they compute (dtypes, sizes and launcher variants folded); the
    kernel table lists those that moved most, enough to explain 90% of the change, and those one side lacks.

    `kernels compare A B`, `kernels compare A1 A2 A3 --against B1 B2 B3`, `kernels compare --baseline a.json B`.
    With several runs a side, each check gets a verdict: regressed or improved when the change passes both
    sides' range over their runs and the floor, else within noise. --plot and --html draw A beside B per
    category and per phase."""
    from profiler_kit.files import check_output_paths, parse_json, read_bytes
    from profiler_kit.kernels import compare, summarize
    from profiler_kit.kernels.runs import Side, saved_side
    from profiler_kit.kernels.summary import NS_PER_MS
    from profiler_kit.render import emit_report, say

    check_output_paths([plot_path, html_path], [*reports, *against, baseline], force)
    if baseline is not None:
        side_a, side_b = None, list(reports) + list(against)
    elif against:
        side_a, side_b = list(reports), list(against)
    elif len(reports) == 2:
        side_a, side_b = [reports[0]], [reports[1]]
    else:
        raise click.UsageError("give two reports (A B), runs of both sides (A1 A2 --against B1 B2), or "
                               "--baseline JSON and B's reports")
    if not side_b or (side_a is not None and not side_a):
        raise click.UsageError("each side needs at least one report")
    options = {"top": top, "phases": list(phases) or None, "nvtx": nvtx}
    b_summaries = [summarize(path, **options) for path in side_b]
    if side_a is None:
        a: Side | list = saved_side(baseline, parse_json(read_bytes(baseline), baseline))
    else:
        a = [summarize(path, **options) for path in side_a]
    summaries = (a if isinstance(a, list) else []) + b_summaries
    if len({s.basis for s in summaries}) > 1:
        kinds = "; ".join(f"{s.path} is timed by {s.timed.lower()}" for s in summaries)
        raise click.UsageError(f"{kinds}: compare reports of the same kind (GPU kernels with GPU kernels, CPU "
                               "trace with CPU trace)")
    min_delta_ns = None if min_delta_ms is None else round(min_delta_ms * NS_PER_MS)
    comparison = compare(a, b_summaries, top=top, fail_above_pct=fail_above, gates=tuple(gates),
                         min_delta_ns=min_delta_ns)
    _write_pictures(comparison, plot_path, html_path)
    emit_report(comparison, fmt)
    if comparison.failed:
        say(f"regression: {len(comparison.failures())} check(s) of B more than {fail_above:g}% and "
            f"{comparison.floor_ns / NS_PER_MS:.3f} ms above A, outside the runs' noise:")
        for line in comparison.failures():
            say(f"  {line}")
        ctx.exit(1)


@kernels.command("whatif", epilog=GPU_SOURCES_HELP)
@click.argument("path", type=click.Path(path_type=Path, readable=False))
@click.option("--speedup", "speedups", metavar="CATEGORY_OR_KERNEL=FACTOR", multiple=True,
              help="Kernels of this category (matmul, attention, ...), launched inside NVTX ranges named NAME "
                   "(range:NAME), else whose name contains this text, run FACTOR times faster (repeatable; the "
                   "last that matches a kernel wins).")
@click.option("--no-launch-gaps", is_flag=True,
              help="Predict a run whose launches never hold the GPU back (CUDA graphs): within each step, every "
                   "kernel is ready when the step's first one is.")
@click.option("--phase", "phases", metavar="NAME", multiple=True,
              help="An NVTX range to report as a phase (repeatable) [default: as `kernels summarize`].")
@format_option(tables=WHATIF_TABLES, columns=report_column)
def whatif_command(path: Path, speedups: tuple[str, ...], no_launch_gaps: bool, phases: tuple[str, ...],
                   fmt: str) -> None:
    """Predict the time of each phase and step if some kernels ran faster, or launches left no gaps (GPU
    reports only).

    Each stream's kernels are replayed in their measured order: a kernel starts at the latest of its launch
    (as measured) plus the launch latency, the end of the previous kernel on its stream plus the queue gap, and
    the end of what it waited for on another stream; latency and gap are measured in the report. With no
    change the replay gives the measured times back. JSON: `measured_ms` and `predicted_ms` per phase and step."""
    from profiler_kit.errors import ProfilerKitError
    from profiler_kit.kernels import load, summarize_trace
    from profiler_kit.kernels.whatif import Speedup, what_if
    from profiler_kit.render import emit_report

    try:
        changes = [Speedup.parse(text) for text in speedups]
    except ProfilerKitError as err:
        raise click.BadParameter(str(err), param_hint="--speedup") from None
    summary = summarize_trace(load(path), phases=list(phases) or None)
    emit_report(what_if(summary, changes, launch_gaps=not no_launch_gaps), fmt)


@kernels.command("timeline", epilog=SOURCES_HELP)
@click.argument("reports", nargs=-1, required=True, type=click.Path(path_type=Path, readable=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The Chrome/Perfetto trace to write (.json, or .json.gz to compress).")
@click.option("--phase", "phases", metavar="NAME", multiple=True,
              help="An NVTX range to show as a phase (repeatable) [default: as `kernels summarize`].")
@click.option("--steps", metavar="A:B", default=None,
              help="Only steps A to B, numbered as the per-step table of `kernels summarize` numbers them (A: or "
                   ":B leaves an end open): the kernels launched in them, the ranges and calls overlapping them.")
@click.option("--window", "span_ms", metavar="START:END", default=None,
              help="Only this span, in milliseconds from the report's first event (kernel, launch, CPU operator or "
                   "NVTX range); START: or :END leaves an end open.")
@JOBS
@FORCE
def timeline_command(reports: tuple[Path, ...], output: Path, phases: tuple[str, ...], steps: str | None,
                     span_ms: str | None, jobs: int, force: bool) -> None:
    """Write the attributed timeline for ui.perfetto.dev: one track per CUDA stream, one of phases (each
    kernel under the phase that launched it, autograd's thread included) and the NVTX ranges; one process
    track per report (e.g. per rank). --steps or --window shows part of each report."""
    from profiler_kit.files import check_output_paths
    from profiler_kit.kernels.ranks import rank_of
    from profiler_kit.kernels.sources import load_many
    from profiler_kit.kernels.timeline import Window, timeline, write_trace
    from profiler_kit.render import say

    check_output_paths([output], reports, force)
    window = Window.parse(steps, span_ms)
    labels = [f"rank {rank_of(path, i)}" if len(reports) > 1 else path.name for i, path in enumerate(reports)]
    traces = list(zip(labels, load_many(list(reports), jobs), strict=True))
    write_trace(timeline(traces, list(phases) or None, window), output, overwrite=force)
    say(f"wrote {output}: open it in ui.perfetto.dev")


COMMANDS = [kernels]
