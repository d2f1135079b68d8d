"""`profiler-kit nsys` (one workload config), `profiler-kit nsys -- COMMAND` (any program) and `profiler-kit nsys
attention` (one attention shape): record under Nsight Systems, or with torch.profiler (`--backend torch`), then
print the kernel summary."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource

from profiler_kit.cli.attention import dtype_names, impl_names
from profiler_kit.cli.common import (
    COMMAND_KEY,
    MODULES_HELP,
    CommandGroup,
    comma_list,
    format_option,
    modules_option,
    non_negative_int,
    one_of,
    positive_float,
    positive_int,
    single,
    workload_options,
)
from profiler_kit.cli.parallel import parallel_option
from profiler_kit.errors import ProfilerKitError
from profiler_kit.names import RECORDING_BACKENDS, SUMMARY_TABLES, report_column

if TYPE_CHECKING:
    from profiler_kit.kernels.phase_metrics import FlopRate
    from profiler_kit.kernels.summary import KernelSummary
    from profiler_kit.recording.builtin import ProfileResult
    from profiler_kit.recording.runner import ParentWindow, ProgramRun

NSYS_PATH = click.option("--nsys", "nsys_path", type=click.Path(path_type=Path),
                         help="The nsys executable (default: $NSYS, PATH, CUDA and Nsight install folders).")
REPLACE = click.option("-f", "--force", is_flag=True,
                       help="Replace existing recordings of the same name once the new one is complete.")


def _recording_options(fn: Callable) -> Callable:
    """Options of both commands: steps, recorder, where the files go, how the summary is shown."""
    options = [
        click.option("--warmup", type=non_negative_int, default=2, show_default=True,
                     help="Steps run before recording (outside the capture range)."),
        click.option("--steps", type=positive_int, default=1, show_default=True, help="Steps recorded."),
        click.option("--backend", type=click.Choice(RECORDING_BACKENDS), default="nsys", show_default=True,
                     help="nsys: Nsight Systems report + SQLite; torch: torch.profiler trace (.json.gz)."),
        NSYS_PATH,
        click.option("--output-dir", type=click.Path(file_okay=False, path_type=Path),
                     default=Path("profiles"), show_default=True),
        REPLACE,
        click.option("--top", type=positive_int, default=15, show_default=True,
                     help="Kernels in the summary."),
        format_option(tables=SUMMARY_TABLES, columns=report_column),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def program_options(within: str = "With -- COMMAND: ") -> Callable:
    """The options of recording a program (`nsys -- COMMAND`, `profile`), each help starting with `within`."""

    def said(text: str) -> str:
        return f"{within}{text}" if within else text[:1].upper() + text[1:]

    options = [
        click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help=said("the report's path without extension [default: profiles/<program>_<timestamp>].")),
        click.option("--nsys-args", default="", metavar="ARGS",
                     help=said("more `nsys profile` flags, one string (e.g. '--trace=cuda,nvtx,osrt').")),
        click.option("--capture/--no-capture", default=True, show_default=True,
                     help=said("under nsys on a GPU, record only the steps profiler_kit.capture marks (else all "
                               "from the first CUDA call); --no-capture records the whole run.")),
        click.option("--phase", "phases", metavar="NAME", multiple=True,
                     help=said("an NVTX range to report as a phase (repeatable) [default: the ranges the report "
                               "holds, see `kernels summarize --help`].")),
        click.option("--flops-per-step", type=positive_float, default=None, metavar="FLOPS",
                     help=said("the model FLOPs of one step, for TFLOP/s (and MFU with --peak-tflops) over the "
                               "phases' GPU span.")),
        click.option("--peak-tflops", type=positive_float, default=None,
                     help=said("the GPU's peak TFLOP/s at the program's precision, for MFU.")),
        modules_option(said(MODULES_HELP)),
    ]

    def decorate(fn: Callable) -> Callable:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return decorate


PROGRAM_ONLY = ("output", "nsys_args", "capture", "phases", "flops_per_step", "peak_tflops", "modules")


@click.group("nsys", cls=CommandGroup, invoke_without_command=True,
             subcommand_metavar="[-- PROGRAM [ARGS]... | attention [OPTIONS]]")
@workload_options(sweep=False)
@parallel_option
@_recording_options
@program_options()
@click.pass_context
def nsys(click_ctx: click.Context, model: str, ctx: int, mode: str, batch_size: int, mixed_precision: bool,
         compile_: bool, cuda_graphs: bool, attention: str, device: str, seed: int, memory_limit_gib: float | None,
         nvtx: bool, optimizer: str, parallel: str, warmup: int, steps: int, backend: str, nsys_path: Path | None,
         output_dir: Path, force: bool, top: int, fmt: str, output: Path | None, nsys_args: str, capture: bool,
         phases: tuple[str, ...], flops_per_step: float | None, peak_tflops: float | None, modules: str) -> None:
    """Profile one training-step config, or any program given after `--`: kernels per phase, under Nsight
    Systems or torch.profiler.

    Built-in workload: writes <output-dir>/<model>_ctx<ctx>_<mode>[_bf16].nsys-rep and .sqlite (or .json.gz
    with --backend torch). It is recorded as a program, the same way as -- COMMAND: only the profiled steps
    (under nsys on a CPU, which has no capture range, the whole run).

    \b
    Any program (`profiler-kit profile` picks the recorder for you):
      profiler-kit nsys [--backend torch] [-o OUT] -- python train.py ARGS

    Records the program's window: the steps it marks with profiler_kit.capture, else what it opens with
    torch.cuda.profiler.start() and stop(), else the whole run; the summary says which, and how many steps.
    With --backend torch the program runs under torch.profiler without a change to its code (one
    OUT.rank<R>.json.gz per torchrun worker); its torch.cuda.nvtx and nvtx-package ranges are in the trace
    too, and a trace without GPU kernels is summarized by CPU operator time. Existing recordings are kept
    unless --force. A recording with no kernels and no operators is an error that says why. Exits with the
    program's exit status (128 + N when a signal N ended it)."""
    given = [p for p in click_ctx.command.params
             if click_ctx.get_parameter_source(p.name) == ParameterSource.COMMANDLINE]
    command = click_ctx.meta.get(COMMAND_KEY)
    if click_ctx.invoked_subcommand is not None:
        # The subcommand has options of its own; any given to the group would be silently ignored.
        if given:
            sub = click_ctx.invoked_subcommand
            raise click.UsageError(f"{', '.join(p.opts[0] for p in given)}: options of `nsys` itself; "
                                   f"`nsys {sub}` takes its own after its name")
        return
    if command is not None:
        shared = (*PROGRAM_ONLY, "backend", "nsys_path", "force", "top", "fmt")
        builtin = [p.opts[0] for p in given if p.name not in shared]
        if builtin:
            raise click.UsageError(f"{', '.join(builtin)}: options of the built-in workload, not of -- COMMAND")
        from profiler_kit.recording.runner import run_program

        run = run_program(command, backend, output, nsys_path, nsys_words(nsys_args), capture, force, modules=modules)
        click_ctx.exit(report_program(run, fmt, top, list(phases) or None, flops_per_step, peak_tflops))
    misplaced = [p.opts[0] for p in given if p.name in PROGRAM_ONLY]
    if misplaced:
        raise click.UsageError(f"{', '.join(misplaced)}: options of -- COMMAND")
    from profiler_kit import distributed
    from profiler_kit.recording.builtin import profile, workload_flops
    from profiler_kit.render import say
    from profiler_kit.workload import WorkloadConfig

    cfg = WorkloadConfig(model, ctx, mode, batch_size, mixed_precision, compile_, attention, device, seed,
                         nvtx, optimizer, parallel=parallel, cuda_graphs=cuda_graphs, memory_limit_gib=memory_limit_gib)
    try:
        result = profile(cfg, warmup, steps, backend, output_dir, nsys_path, force)
    finally:
        distributed.leave()
    rank = distributed.torchrun_rank().rank if parallel != "none" else 0
    if rank != 0:
        say(f"rank {rank} recorded " + ", ".join(map(str, result.paths)) + "; rank 0 prints its summary")
        return
    from profiler_kit.kernels.phase_metrics import FlopRate

    per_phase, peak = workload_flops(cfg)
    _report(result, fmt, top, FlopRate(per_phase=per_phase, peak_tflops=peak))
    if parallel != "none":
        every_rank = str(result.summary_source).replace(".rank0.", ".rank*.")
        say(f"that is rank 0's; every rank and merged: profiler-kit kernels summarize {every_rank}")


@nsys.command("attention")
@click.option("--impl", "impls", callback=comma_list(one_of(impl_names)),
              help="Implementations, comma list (default: all those of `attention bench`).")
@click.option("--batch", type=positive_int, default=8, show_default=True)
@click.option("--heads", type=positive_int, default=None,
              help="Heads; without it inputs have no head dimension: (batch, seq, d).")
@click.option("--seq", type=positive_int, default=4096, show_default=True)
@click.option("--d", type=positive_int, default=64, show_default=True, help="Head dim.")
@click.option("--dtype", default="bf16", show_default=True, callback=single(one_of(dtype_names)))
@click.option("--causal/--no-causal", default=True, show_default=True)
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True)
@_recording_options
def attention_cmd(impls: list[str] | None, batch: int, heads: int | None, seq: int, d: int, dtype: str,
                  causal: bool, device: str, warmup: int, steps: int, backend: str, nsys_path: Path | None,
                  output_dir: Path, force: bool, top: int, fmt: str) -> None:
    """Profile each attention implementation's forward and backward on one shape.

    NVTX ranges: <impl> holding <impl>.forward and <impl>.backward. Implementations that cannot run the shape
    here are skipped with a note. Writes <output-dir>/attention_<dtype>_b<batch>[_h<heads>]_s<seq>_d<d>
    [_causal].nsys-rep and .sqlite (or .json.gz)."""
    from profiler_kit.attention.registry import BENCH_IMPLS
    from profiler_kit.recording.builtin import AttentionProfileConfig, profile_attention

    cfg = AttentionProfileConfig(tuple(impls or BENCH_IMPLS), dtype, causal, batch, heads, seq, d, device)
    result = profile_attention(cfg, warmup, steps, backend, output_dir, nsys_path, force)
    _report(result, fmt, top)


def _report(result: ProfileResult, fmt: str, top: int, rate: FlopRate | None = None) -> None:
    from profiler_kit.render import emit_report, say

    say(f"{result.window.describe()} on {result.device}: " + ", ".join(map(str, result.paths)))
    from profiler_kit.kernels import summarize

    summary = summarize(result.summary_source, top=top, phases=list(result.phases))
    _refuse_empty(summary, result.backend, result.window)
    summary.notes.extend(result.window.summary_notes())
    if rate is not None:
        summary = summary.with_flops(rate)
    emit_report(summary, fmt)


def nsys_words(nsys_args: str) -> tuple[str, ...]:
    """The words of --nsys-args (a usage error for an unbalanced quote)."""
    try:
        return tuple(shlex.split(nsys_args))
    except ValueError as exc:
        raise click.BadParameter(f"{exc} in {nsys_args!r}", param_hint="--nsys-args") from None


def _refuse_empty(summary: KernelSummary, backend: str, window: ParentWindow) -> None:
    """A recording without kernels and without operators is an error that says why."""
    from profiler_kit.recording.runner import nothing_recorded

    if not len(summary.kernels):
        raise ProfilerKitError(f"{summary.path}: {nothing_recorded(backend, window)}")


def report_program(run: ProgramRun, fmt: str, top: int, phases: list[str] | None, flops_per_step: float | None,
                    peak_tflops: float | None) -> int:
    """Summarize what a program's run recorded; the exit status to leave with: the program's."""
    from profiler_kit.render import emit_report, say

    if run.files:
        say(f"{run.window.describe()}: " + ", ".join(str(p) for p in run.files))
    if run.exit_code != 0:
        kept = "the summary covers what was recorded" if run.sources else "nothing was recorded"
        say(f"the program exited with status {run.exit_code}; {kept}")
    if not run.sources:
        for line in run.window.notes:  # what the recorder could not record, and why
            say(f"note: {line}")
        if run.exit_code == 0:
            why = "the recorder failed" if run.window.notes else "it started no Python program that imports torch"
            raise ProfilerKitError(f"the command wrote no trace: {why}")
        return run.exit_code
    from profiler_kit.kernels import summarize_trace
    from profiler_kit.kernels.rank_rows import RowOptions
    from profiler_kit.kernels.ranks import rank_traces, summarize_ranks

    ranks = rank_traces(list(run.sources))
    if len(ranks) > 1 or ".rank" in run.sources[0].name:
        ranked = summarize_ranks(ranks, RowOptions(top, tuple(phases) if phases else None))
        ranked.job_notes.extend(run.window.summary_notes())
        emit_report(ranked, fmt)
        return run.exit_code
    summary = summarize_trace(ranks[0][1], top=top, phases=phases)
    if run.exit_code == 0:
        _refuse_empty(summary, run.backend, run.window)
    summary.notes.extend(run.window.summary_notes())
    if flops_per_step is not None:
        from profiler_kit.kernels.phase_metrics import FlopRate

        summary = summary.with_flops(FlopRate(per_step=flops_per_step, peak_tflops=peak_tflops))
    emit_report(summary, fmt)
    return run.exit_code


COMMANDS = [nsys]
