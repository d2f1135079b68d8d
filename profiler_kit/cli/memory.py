"""`profiler-kit memory` (record a snapshot around one config's steps, then explain it), `profiler-kit memory --
COMMAND` (record any program's window), `profiler-kit memory summarize FILE.pickle` (explain any snapshot) and
`profiler-kit memory compare A B`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource

from profiler_kit.cli.common import (
    COMMAND_KEY,
    FORCE,
    MODULES_HELP,
    CommandGroup,
    format_option,
    modules_option,
    non_negative_int,
    positive_int,
    workload_options,
)
from profiler_kit.defaults import DEFAULT_MAX_ENTRIES, DEFAULT_MODULES, DEFAULT_OUTPUT_DIR, MEMORY_TOP
from profiler_kit.errors import ProfilerKitError
from profiler_kit.names import MEMORY_COMPARE_TABLES, MEMORY_REPORT_TABLES, report_column

if TYPE_CHECKING:
    from profiler_kit.memory import MemoryReport


def _report_options(fn):
    fn = format_option(tables=MEMORY_REPORT_TABLES, columns=report_column)(fn)
    return click.option("--top", type=positive_int, default=MEMORY_TOP, show_default=True,
                        help="How many of the largest allocations alive at the peak to list.")(fn)


def _plot(report: MemoryReport, path: Path) -> Path:
    from profiler_kit.memory import plot_timeline

    return plot_timeline(report.recon, report.roles, report.spans, path, report.title())


MAX_ENTRIES = click.option("--max-entries", type=positive_int, default=DEFAULT_MAX_ENTRIES, show_default=True,
                           help="Allocator events kept (a ring buffer: older ones are dropped beyond this).")

# The options `-- COMMAND` takes; every other one is the built-in workload's.
PROGRAM_OPTIONS = ("output", "force", "max_entries", "modules", "top", "fmt")


@click.group("memory", cls=CommandGroup, invoke_without_command=True,
             subcommand_metavar="[-- PROGRAM [ARGS]... | summarize | compare]")
@workload_options(sweep=False)
@click.option("--warmup", type=non_negative_int, default=1, show_default=True,
              help="Unrecorded steps first (they allocate AdamW state and settle the allocator's cache).")
@click.option("--steps", type=positive_int, default=1, show_default=True, help="Recorded steps.")
@MAX_ENTRIES
@click.option("--output-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_OUTPUT_DIR,
              show_default=True, help="Where <model>_ctx<ctx>_<mode>[_bf16].pickle/.json/.png/.html go.")
@click.option("--plot/--no-plot", default=True, show_default=True,
              help="Write the timeline PNG (stacked by role) beside the pickle.")
@click.option("--html/--no-html", "html", default=True, show_default=True,
              help="Write the self-contained HTML report beside the pickle.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="With -- COMMAND: the snapshot's path without extension [default: "
                   "memory_snapshots/<program>_<timestamp>].")
@FORCE
@modules_option("With -- COMMAND: " + MODULES_HELP)
@_report_options
@click.pass_context
def memory_cmd(click_ctx: click.Context, model, ctx, mode, batch_size, mixed_precision, compile_, cuda_graphs,
               attention, device, seed, memory_limit_gib, nvtx, optimizer, warmup, steps, max_entries, output_dir,
               plot, html, output, force, modules, top, fmt) -> None:
    """Record CUDA memory history around one config's steps, or over any program's window, dump the snapshot,
    and explain its peak.

    \b
    Any program (or `profiler-kit profile --memory -- ...`):
      profiler-kit memory [-o OUT] [--max-entries N] -- python train.py ARGS

    Records the program's window: the steps it marks with profiler_kit.capture, else what it opens with
    torch.cuda.profiler.start() and stop(), else from CUDA's start-up to exit; the storages of its parameters,
    gradients and optimizer state are listed in the snapshot at the window's start and after each optimizer
    step. Writes OUT.pickle (OUT.rank<R>.pickle per torchrun worker), also when the program runs out of
    memory, and prints the report of `memory summarize` for each, then, for several ranks, their merged view.
    Exits with the program's exit status (128 + N when a signal N ended it).

    Run `profiler-kit memory summarize FILE.pickle` to explain any snapshot, also on a machine without a GPU;
    the options above apply to recording only. The HTML report opens offline; the pickle also opens at
    https://pytorch.org/memory_viz.
    """
    if click_ctx.invoked_subcommand is not None:
        return
    given = [p for p in click_ctx.command.params
             if click_ctx.get_parameter_source(p.name) == ParameterSource.COMMANDLINE]
    command = click_ctx.meta.get(COMMAND_KEY)
    if command is not None:
        builtin = [p.opts[0] for p in given if p.name not in PROGRAM_OPTIONS]
        if builtin:
            raise click.UsageError(f"{', '.join(builtin)}: options of the built-in workload, not of -- COMMAND")
        click_ctx.exit(record_program(command, output, max_entries, force, top, fmt, modules))
    misplaced = [p.opts[0] for p in given if p.name in ("output", "force", "modules")]
    if misplaced:
        raise click.UsageError(f"{', '.join(misplaced)}: options of -- COMMAND")
    from profiler_kit.memory import analyze_file, write_html
    from profiler_kit.memory.html import MEMORY_VIZ_URL
    from profiler_kit.recording.builtin import record_memory, require_cuda
    from profiler_kit.render import console_err, emit_report, say
    from profiler_kit.workload import WorkloadConfig

    cfg = WorkloadConfig(model, ctx, mode, batch_size, mixed_precision, compile_, attention, device, seed,
                         nvtx, optimizer, cuda_graphs=cuda_graphs, memory_limit_gib=memory_limit_gib)
    require_cuda(cfg)
    with console_err.status("recording") as status:
        result = record_memory(cfg, steps, warmup, max_entries, output_dir, on_progress=status.update)
    report = analyze_file(result.snapshot_path, top)
    written = [result.snapshot_path, result.sidecar_path]
    if plot:
        written.append(_plot(report, result.snapshot_path.with_suffix(".png")))
    if html:
        written.append(write_html(report, result.snapshot_path.with_suffix(".html")))
    emit_report(report, fmt)
    say(f"wrote {', '.join(map(str, written))} (the pickle also opens at {MEMORY_VIZ_URL})")
    if result.oom:
        oom = result.oom
        where = f"recorded step {oom['step'] + 1}" if oom["step"] >= 0 else "a warm-up step"
        raise ProfilerKitError(f"out of memory in {oom['phase']} of {where} ({oom['summary']}); the snapshot "
                               f"was saved anyway: {result.snapshot_path}")


def record_program(command: list[str], output: Path | None, max_entries: int, force: bool, top: int, fmt: str,
                   modules: str = DEFAULT_MODULES) -> int:
    """Record `command`'s memory history (`recording.runner`), print each snapshot's report; the program's exit
    status."""
    from profiler_kit.memory import analyze_file
    from profiler_kit.memory.html import MEMORY_VIZ_URL
    from profiler_kit.memory.ranks import merge, rank_peak
    from profiler_kit.recording.runner import MEMORY, default_output, run_program
    from profiler_kit.render import emit_report, say

    output = output if output is not None else default_output(command, DEFAULT_OUTPUT_DIR)
    run = run_program(command, MEMORY, output, force=force, max_entries=max_entries, modules=modules)
    if run.files:
        say(f"{run.window.describe()}: {', '.join(map(str, run.files))} (the pickle also opens at {MEMORY_VIZ_URL})")
    if run.exit_code != 0:
        kept = "the report covers what was recorded" if run.files else "nothing was recorded"
        say(f"the program exited with status {run.exit_code}; {kept}")
    if not run.files and run.exit_code == 0:
        raise ProfilerKitError("the command wrote no snapshot: it started no Python program that used CUDA")
    peaks = []
    for position, path in enumerate(run.files):
        report = analyze_file(path, top)
        report.notes.extend(run.window.summary_notes())
        emit_report(report, fmt)
        peaks.append(rank_peak(report, position))
    if len(peaks) > 1:
        emit_report(merge(peaks), fmt)
    return run.exit_code


_DEVICE_INDEX = click.option("--device-index", type=non_negative_int, default=None,
                             help="The GPU whose trace to analyse (default: the one with the most events).")
_SIDECAR = click.option("--sidecar/--no-sidecar", "use_sidecar", default=True, show_default=True,
                        help="Read the recorder's <stem>.json beside a pickle; without it, the metadata the "
                             "recorder stored in the pickle itself is used.")


@memory_cmd.command("summarize")
@click.argument("snapshots", nargs=-1, required=True, metavar="SNAPSHOT...")
@_DEVICE_INDEX
@_SIDECAR
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the timeline PNG, stacked by role, to this path.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the self-contained HTML report (opens offline) to this path.")
@FORCE
@_report_options
def summarize_cmd(snapshots: tuple[str, ...], device_index: int | None, use_sidecar: bool, plot_path: Path | None,
                  html_path: Path | None, force: bool, top: int, fmt: str) -> None:
    """Peak allocated and reserved memory, peaks per step and phase, bytes per role at the peak, the largest
    allocations alive at it and where they were made, and expected vs measured tensor sizes, for any CUDA memory
    snapshot pickle. Phases come from the recorder's metadata (its sidecar <stem>.json, or stored in the pickle),
    else from the record_function ranges the snapshot holds, else from its stacks.

    Several snapshots of one job's ranks (files, their stem OUT for OUT.rank<R>.pickle, or a quoted glob) give the
    merged view: each rank's peak and roles, which rank peaks highest and by what."""
    from profiler_kit.files import check_output_paths
    from profiler_kit.memory import analyze_file, write_html
    from profiler_kit.memory.ranks import snapshot_paths, summarize_ranks
    from profiler_kit.memory.snapshot import sidecar_path
    from profiler_kit.render import emit_report, say

    paths = snapshot_paths(snapshots)
    if len(paths) > 1:
        if plot_path or html_path:
            raise click.UsageError("--plot and --html draw one snapshot; give one")
        emit_report(summarize_ranks(paths, device_index, use_sidecar), fmt)
        return
    snapshot = paths[0]
    check_output_paths([plot_path, html_path], [snapshot, sidecar_path(snapshot)], force)
    report = analyze_file(snapshot, top, device_index, use_sidecar)
    for path, write in ((plot_path, _plot), (html_path, write_html)):
        if path is not None:
            write(report, path)
            say(f"wrote {path}")
    emit_report(report, fmt)


@memory_cmd.command("compare")
@click.argument("snapshot_a", type=click.Path(path_type=Path, readable=False))
@click.argument("snapshot_b", type=click.Path(path_type=Path, readable=False))
@_DEVICE_INDEX
@_SIDECAR
@format_option(tables=MEMORY_COMPARE_TABLES, columns=report_column)
def compare_cmd(snapshot_a: Path, snapshot_b: Path, device_index: int | None, use_sidecar: bool,
                fmt: str) -> None:
    """Two snapshots side by side: peak allocated and reserved, the peak of each phase (by name) and bytes per
    role at each one's peak, with B − A in MiB and in % of A."""
    from profiler_kit.memory import analyze_file, compare
    from profiler_kit.render import emit_report

    emit_report(compare(analyze_file(snapshot_a, device=device_index, use_sidecar=use_sidecar),
                        analyze_file(snapshot_b, device=device_index, use_sidecar=use_sidecar)), fmt)


COMMANDS = [memory_cmd]
