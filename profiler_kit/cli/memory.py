"""`profiler-kit memory` (record a snapshot around one config's steps, then explain it) and
`profiler-kit memory summarize FILE.pickle` (explain any snapshot)."""

from __future__ import annotations

from pathlib import Path

import click

from profiler_kit.cli.common import non_negative_int, positive_int, workload_options
from profiler_kit.errors import ProfilerKitError
from profiler_kit.memory import (
    DEFAULT_MAX_ENTRIES,
    DEFAULT_OUTPUT_DIR,
    DEFAULT_TOP,
    MemoryReport,
    analyze_file,
    plot_timeline,
    record,
)
from profiler_kit.memory.recorder import require_cuda
from profiler_kit.render import console_err, emit_tables
from profiler_kit.workload import WorkloadConfig

MEMORY_FORMATS = ("table", "json", "markdown")
MEMORY_VIZ_URL = "https://pytorch.org/memory_viz"


def _report_options(fn):
    fn = click.option("--format", "fmt", type=click.Choice(MEMORY_FORMATS), default="table",
                      show_default=True, help="table for people; json/markdown print only that on stdout.",
                      )(fn)
    return click.option("--top", type=positive_int, default=DEFAULT_TOP, show_default=True,
                        help="How many of the largest allocations alive at the peak to list.")(fn)


def _emit(report: MemoryReport, fmt: str) -> None:
    caption = (f"{report.source}: device {report.recon.device}, {report.recon.n_entries:,} trace entries; "
               "MiB = 2^20 bytes")
    emit_tables(report.tables(), fmt, json_obj=report.as_json(), caption=caption)
    if fmt != "json":
        for note in report.notes:
            console_err.print(f"[yellow]note:[/] {note}", highlight=False)


@click.group("memory", invoke_without_command=True)
@workload_options(sweep=False)
@click.option("--warmup", type=non_negative_int, default=1, show_default=True,
              help="Unrecorded steps first (they allocate AdamW state and settle the allocator's cache).")
@click.option("--steps", type=positive_int, default=1, show_default=True, help="Recorded steps.")
@click.option("--max-entries", type=positive_int, default=DEFAULT_MAX_ENTRIES, show_default=True,
              help="Allocator events kept (a ring buffer: older ones are dropped beyond this).")
@click.option("--output-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_OUTPUT_DIR,
              show_default=True, help="Where <model>_ctx<ctx>_<mode>[_bf16].pickle/.json/.png go.")
@click.option("--plot/--no-plot", default=True, show_default=True,
              help="Write the timeline PNG beside the pickle.")
@_report_options
@click.pass_context
def memory_cmd(click_ctx: click.Context, model, ctx, mode, batch_size, mixed_precision, compile_, attention,
               device, seed, nvtx, optimizer, warmup, steps, max_entries, output_dir, plot, top, fmt) -> None:
    """Record CUDA memory history around one config's steps, dump the snapshot, and explain its peak.

    Run `profiler-kit memory summarize FILE.pickle` to explain any snapshot, also on a machine without a GPU;
    the options above apply to recording only. The pickle opens at https://pytorch.org/memory_viz.
    """
    if click_ctx.invoked_subcommand is not None:
        return
    cfg = WorkloadConfig(model, ctx, mode, batch_size, mixed_precision, compile_, attention, device, seed,
                         nvtx, optimizer)
    require_cuda(cfg)
    with console_err.status("recording") as status:
        result = record(cfg, steps, warmup, max_entries, output_dir, on_progress=status.update)
    report = analyze_file(result.snapshot_path, top)
    written = [result.snapshot_path, result.sidecar_path]
    if plot:
        written.append(plot_timeline(report.recon, report.spans, result.snapshot_path.with_suffix(".png"),
                                     report.title()))
    _emit(report, fmt)
    console_err.print(f"wrote {', '.join(map(str, written))} (open the pickle at {MEMORY_VIZ_URL})",
                      highlight=False)
    if result.oom:
        oom = result.oom
        raise ProfilerKitError(f"out of memory in {oom['phase']} of recorded step {oom['step'] + 1} "
                               f"({oom['summary']}); the snapshot was saved anyway: {result.snapshot_path}")


@memory_cmd.command("summarize")
@click.argument("snapshot", type=click.Path(path_type=Path))
@click.option("--device-index", type=non_negative_int, default=None,
              help="The GPU whose trace to analyse (default: the one with the most events).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the timeline PNG to this path.")
@_report_options
def summarize_cmd(snapshot: Path, device_index: int | None, plot_path: Path | None, top: int,
                  fmt: str) -> None:
    """Peak allocated and reserved memory, per-phase peaks, the largest allocations alive at the peak and
    where they were made, and expected vs measured tensor sizes, for any CUDA memory snapshot pickle (with
    the recorder's sidecar <stem>.json when it sits beside it)."""
    report = analyze_file(snapshot, top, device_index)
    if plot_path is not None:
        plot_timeline(report.recon, report.spans, plot_path, report.title())
        console_err.print(f"wrote {plot_path}", highlight=False)
    _emit(report, fmt)


COMMANDS = [memory_cmd]
