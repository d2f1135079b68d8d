"""`profiler-kit kernels summarize|compare|speedtest`: where GPU time goes, from any kernel report."""

from __future__ import annotations

import tempfile
from pathlib import Path

import click

from profiler_kit.cli.common import format_option, positive_int
from profiler_kit.kernels import DEFAULT_TOP, compare, summarize
from profiler_kit.kernels.speedtest import DEFAULT_KERNELS, build_repeated_export, time_summary
from profiler_kit.render import console_err, emit_tables

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
        help="An NVTX range to report as a phase (repeatable) [default: forward, backward, optimizer_step].",
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
@click.argument("path", type=click.Path(path_type=Path))
@_analysis_options
def summarize_command(path: Path, top: int, nvtx: str | None, phases: tuple[str, ...], fmt: str) -> None:
    """Summarize the kernels of one report."""
    summarize(path, top=top, phases=list(phases) or None, nvtx=nvtx).render(fmt)


@kernels.command("compare", epilog=SOURCES_HELP)
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@_analysis_options
def compare_command(a: Path, b: Path, top: int, nvtx: str | None, phases: tuple[str, ...], fmt: str) -> None:
    """Compare two reports: time per category, phase and kernel in A and B, delta (B − A), speedup (A / B)."""
    options = {"top": top, "phases": list(phases) or None, "nvtx": nvtx}
    compare(summarize(a, **options), summarize(b, **options), top=top).render(fmt)


@kernels.command("speedtest")
@click.argument("source", type=click.Path(path_type=Path))
@click.option(
    "--kernels",
    "kernel_count",
    type=positive_int,
    default=DEFAULT_KERNELS,
    show_default=True,
    help="Repeat SOURCE until the test report holds at least this many kernels.",
)
@click.option("--repeats", type=positive_int, default=3, show_default=True, help="Best of this many runs.")
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where to write the big report (default: a temporary folder, removed afterwards).",
)
@format_option()
def speedtest_command(source: Path, kernel_count: int, repeats: int, workdir: Path | None, fmt: str) -> None:
    """Time `kernels summarize` on SOURCE (an nsys .sqlite export) repeated to ~1M kernels, against one SQL
    query that joins kernels to their launches and groups by name. The target: within 4x of the query."""
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        big = Path(tmp) / f"{source.stem}_x.sqlite"
        console_err.print(f"building {big} from {source} (≥ {kernel_count:,} kernels)…")
        copies = build_repeated_export(source, big, kernel_count)
        console_err.print(f"{copies} copies of {source.name}; timing (best of {repeats})…")
        table = time_summary(big, repeats)
    emit_tables([("kernels summarize vs one SQL query", table)], fmt)


COMMANDS = [kernels]
