"""`profiler-kit memory` (record a snapshot around one config's steps, then explain it),
`profiler-kit memory summarize FILE.pickle` (explain any snapshot) and `profiler-kit memory compare A B`."""

from __future__ import annotations

from pathlib import Path

import click

from profiler_kit.cli.common import FORCE, ProgramGroup, format_option, non_negative_int, positive_int, workload_options
from profiler_kit.errors import ProfilerKitError
from profiler_kit.files import check_output_paths
from profiler_kit.memory import DEFAULT_TOP, MemoryReport, analyze_file, compare, plot_timeline, write_html
from profiler_kit.memory.html import MEMORY_VIZ_URL
from profiler_kit.memory.snapshot import sidecar_path
from profiler_kit.names import DEFAULT_MAX_ENTRIES, DEFAULT_OUTPUT_DIR
from profiler_kit.render import console_err, emit_report, say


def _report_options(fn):
    fn = format_option()(fn)
    return click.option("--top", type=positive_int, default=DEFAULT_TOP, show_default=True,
                        help="How many of the largest allocations alive at the peak to list.")(fn)


def _plot(report: MemoryReport, path: Path) -> Path:
    return plot_timeline(report.recon, report.roles, report.spans, path, report.title())


@click.group("memory", cls=ProgramGroup, invoke_without_command=True)
@workload_options(sweep=False)
@click.option("--warmup", type=non_negative_int, default=1, show_default=True,
              help="Unrecorded steps first (they allocate AdamW state and settle the allocator's cache).")
@click.option("--steps", type=positive_int, default=1, show_default=True, help="Recorded steps.")
@click.option("--max-entries", type=positive_int, default=DEFAULT_MAX_ENTRIES, show_default=True,
              help="Allocator events kept (a ring buffer: older ones are dropped beyond this).")
@click.option("--output-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_OUTPUT_DIR,
              show_default=True, help="Where <model>_ctx<ctx>_<mode>[_bf16].pickle/.json/.png/.html go.")
@click.option("--plot/--no-plot", default=True, show_default=True,
              help="Write the timeline PNG (stacked by role) beside the pickle.")
@click.option("--html/--no-html", "html", default=True, show_default=True,
              help="Write the self-contained HTML report beside the pickle.")
@_report_options
@click.pass_context
def memory_cmd(click_ctx: click.Context, model, ctx, mode, batch_size, mixed_precision, compile_, cuda_graphs,
               attention, device, seed, nvtx, optimizer, warmup, steps, max_entries, output_dir, plot, html, top,
               fmt) -> None:
    """Record CUDA memory history around one config's steps, dump the snapshot, and explain its peak.

    Run `profiler-kit memory summarize FILE.pickle` to explain any snapshot, also on a machine without a GPU;
    the options above apply to recording only. The HTML report opens offline; the pickle also opens at
    https://pytorch.org/memory_viz.
    """
    if click_ctx.invoked_subcommand is not None:
        return
    from profiler_kit.memory.recorder import record, require_cuda
    from profiler_kit.workload import WorkloadConfig

    cfg = WorkloadConfig(model, ctx, mode, batch_size, mixed_precision, compile_, attention, device, seed,
                         nvtx, optimizer, cuda_graphs=cuda_graphs)
    require_cuda(cfg)
    with console_err.status("recording") as status:
        result = record(cfg, steps, warmup, max_entries, output_dir, on_progress=status.update)
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
        raise ProfilerKitError(f"out of memory in {oom['phase']} of recorded step {oom['step'] + 1} "
                               f"({oom['summary']}); the snapshot was saved anyway: {result.snapshot_path}")


_DEVICE_INDEX = click.option("--device-index", type=non_negative_int, default=None,
                             help="The GPU whose trace to analyse (default: the one with the most events).")
_SIDECAR = click.option("--sidecar/--no-sidecar", "use_sidecar", default=True, show_default=True,
                        help="Read the recorder's <stem>.json beside a pickle; without it, the metadata the "
                             "recorder stored in the pickle itself is used.")


@memory_cmd.command("summarize")
@click.argument("snapshot", type=click.Path(path_type=Path))
@_DEVICE_INDEX
@_SIDECAR
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the timeline PNG, stacked by role, to this path.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the self-contained HTML report (opens offline) to this path.")
@FORCE
@_report_options
def summarize_cmd(snapshot: Path, device_index: int | None, use_sidecar: bool, plot_path: Path | None,
                  html_path: Path | None, force: bool, top: int, fmt: str) -> None:
    """Peak allocated and reserved memory, per-phase peaks, bytes per role at the peak, the largest allocations
    alive at it and where they were made, and expected vs measured tensor sizes, for any CUDA memory snapshot
    pickle. Phases come from the recorder's metadata (its sidecar <stem>.json, or stored in the pickle), else
    from the record_function ranges the snapshot holds."""
    check_output_paths([plot_path, html_path], [snapshot, sidecar_path(snapshot)], force)
    report = analyze_file(snapshot, top, device_index, use_sidecar)
    for path, write in ((plot_path, _plot), (html_path, write_html)):
        if path is not None:
            write(report, path)
            say(f"wrote {path}")
    emit_report(report, fmt)


@memory_cmd.command("compare")
@click.argument("snapshot_a", type=click.Path(path_type=Path))
@click.argument("snapshot_b", type=click.Path(path_type=Path))
@_DEVICE_INDEX
@_SIDECAR
@format_option()
def compare_cmd(snapshot_a: Path, snapshot_b: Path, device_index: int | None, use_sidecar: bool,
                fmt: str) -> None:
    """Two snapshots side by side: peak allocated and reserved, the peak of each phase (by name) and bytes per
    role at each one's peak, with B − A in MiB and in % of A."""
    emit_report(compare(analyze_file(snapshot_a, device=device_index, use_sidecar=use_sidecar),
                        analyze_file(snapshot_b, device=device_index, use_sidecar=use_sidecar)), fmt)


COMMANDS = [memory_cmd]
