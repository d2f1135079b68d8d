"""`profiler-kit kernels summarize|compare|whatif|timeline`: where GPU time goes, from any kernel report."""

from __future__ import annotations

from pathlib import Path

import click

from profiler_kit.cli.common import format_option, positive_int
from profiler_kit.errors import ProfilerKitError
from profiler_kit.kernels import DEFAULT_TOP, compare, load, summarize, summarize_trace
from profiler_kit.kernels.phases import RULE as PHASE_RULE
from profiler_kit.kernels.ranks import rank_of, rank_traces, summarize_ranks
from profiler_kit.kernels.timeline import timeline, write_trace
from profiler_kit.kernels.whatif import Speedup, what_if
from profiler_kit.render import console_err, emit_report

SOURCES_HELP = (
    "A report is an nsys .nsys-rep or its .sqlite export, `nsys stats` cuda_gpu_kern_sum output (CSV or "
    "text table, any nsys version or --timeunit), or a torch.profiler Chrome trace (.json, .json.gz)."
)


# The options summarize and compare share, in the order --help lists them.
_ANALYSIS_OPTIONS = (
    click.option(
        "--top", type=positive_int, default=DEFAULT_TOP, show_default=True, help="How many kernels to list."
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
    format_option(),
)


def _analysis_options(fn):
    for option in reversed(_ANALYSIS_OPTIONS):
        fn = option(fn)
    return fn


@click.group("kernels")
def kernels() -> None:
    """Kernel time by category (matmul, attention, elementwise, ...), per phase and per kernel."""


@kernels.command("summarize", epilog=SOURCES_HELP)
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@_analysis_options
@click.option("--flops-per-step", type=click.FloatRange(min=0, min_open=True), default=None, metavar="FLOPS",
              help="The model FLOPs of one step: TFLOP/s (and MFU with --peak-tflops) over the phases' GPU span.")
@click.option("--peak-tflops", type=click.FloatRange(min=0, min_open=True), default=None,
              help="The GPU's peak TFLOP/s at the run's precision, for MFU.")
def summarize_command(paths: tuple[Path, ...], top: int, nvtx: str | None, phases: tuple[str, ...], fmt: str,
                      flops_per_step: float | None, peak_tflops: float | None) -> None:
    """Summarize the kernels of one report: by category, per kernel, per phase, and where the GPU idles in
    each phase (launch-bound when idle above half of the phase's GPU span; one long gap, such as start-up or
    autotuning, is named instead). A report whose phases sit in a repeating range (`step`, `ProfilerStep#N`)
    gets a per-step table, warm-up steps apart, and the idle verdicts come from the steady steps. A range
    outside the phases holding more than 5% of the time is named in a note.

    Several reports are the ranks of one job (`<stem>.rank<R>.json.gz`, else in the order given): a table per
    rank, the merged categories, communication per phase (overlapped by compute elsewhere, and exposed) and
    each phase's spread across ranks with its slowest rank."""
    ranks = rank_traces(list(paths))
    if len(ranks) > 1:
        if nvtx is not None or flops_per_step is not None:
            raise click.UsageError("--nvtx and --flops-per-step take the report of one process")
        emit_report(summarize_ranks(ranks, top=top, phases=list(phases) or None), fmt)
        return
    summary = summarize_trace(ranks[0][1], top=top, phases=list(phases) or None, nvtx=nvtx)
    if flops_per_step is not None:
        summary.add_flops(per_step=flops_per_step, peak_tflops=peak_tflops)
    emit_report(summary, fmt)


@kernels.command("compare", epilog=SOURCES_HELP)
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@_analysis_options
@click.option("--fail-above", "fail_above", type=click.FloatRange(min=0), metavar="PCT", default=None,
              help="Exit 1 when B's kernel time (total, or any phase or category both have) is more than PCT "
                   "percent above A's; the verdict is in the JSON's `gate`.")
@click.pass_context
def compare_command(ctx: click.Context, a: Path, b: Path, top: int, nvtx: str | None, phases: tuple[str, ...],
                    fmt: str, fail_above: float | None) -> None:
    """Compare two reports: time per category, phase and kernel in A and B, delta (B − A), speedup (A / B)."""
    options = {"top": top, "phases": list(phases) or None, "nvtx": nvtx}
    comparison = compare(summarize(a, **options), summarize(b, **options), top=top, fail_above_pct=fail_above)
    emit_report(comparison, fmt)
    if comparison.failed:
        console_err.print(f"regression: B is more than {fail_above:g}% above A", soft_wrap=True)
        ctx.exit(1)


@kernels.command("whatif", epilog=SOURCES_HELP)
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--speedup", "speedups", metavar="CATEGORY_OR_KERNEL=FACTOR", multiple=True,
              help="Kernels of this category (matmul, attention, ...), launched inside NVTX ranges named NAME "
                   "(range:NAME), else whose name contains this text, run FACTOR times faster (repeatable; the "
                   "last that matches a kernel wins).")
@click.option("--no-launch-gaps", is_flag=True,
              help="Predict a run whose launches never hold the GPU back (CUDA graphs): within each step, every "
                   "kernel is ready when the step's first one is.")
@click.option("--phase", "phases", metavar="NAME", multiple=True,
              help="An NVTX range to report as a phase (repeatable) [default: as `kernels summarize`].")
@format_option()
def whatif_command(path: Path, speedups: tuple[str, ...], no_launch_gaps: bool, phases: tuple[str, ...],
                   fmt: str) -> None:
    """Predict the time of each phase and step if some kernels ran faster, or launches left no gaps.

    Each stream's kernels are replayed in their measured order: a kernel starts at the latest of its launch
    (as measured) plus the launch latency, the end of the previous kernel on its stream plus the queue gap, and
    the end of what it waited for on another stream; latency and gap are measured in the report. With no
    change the replay gives the measured times back. JSON: `measured_ms` and `predicted_ms` per phase and step."""
    try:
        changes = [Speedup.parse(text) for text in speedups]
    except ProfilerKitError as err:
        raise click.BadParameter(str(err), param_hint="--speedup") from None
    summary = summarize_trace(load(path), phases=list(phases) or None)
    emit_report(what_if(summary, changes, launch_gaps=not no_launch_gaps), fmt)


@kernels.command("timeline", epilog=SOURCES_HELP)
@click.argument("reports", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The Chrome/Perfetto trace to write (.json, or .json.gz to compress); never replaced.")
@click.option("--phase", "phases", metavar="NAME", multiple=True,
              help="An NVTX range to show as a phase (repeatable) [default: as `kernels summarize`].")
def timeline_command(reports: tuple[Path, ...], output: Path, phases: tuple[str, ...]) -> None:
    """Write the attributed timeline for ui.perfetto.dev: one track per CUDA stream, one of phases (each
    kernel under the phase that launched it, autograd's thread included) and the NVTX ranges; one process
    track per report (e.g. per rank)."""
    labels = [f"rank {rank_of(path, i)}" if len(reports) > 1 else path.name for i, path in enumerate(reports)]
    traces = [(label, load(path)) for label, path in zip(labels, reports, strict=True)]
    write_trace(timeline(traces, list(phases) or None), output)
    console_err.print(f"wrote {output}: open it in ui.perfetto.dev", soft_wrap=True)


COMMANDS = [kernels]
