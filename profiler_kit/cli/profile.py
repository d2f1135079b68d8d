"""`profiler-kit profile [OPTIONS] -- COMMAND`: the first command to type. Records any program with the best
recorder of the machine (`recording.runner.choose_recorder`), says which and why, and prints the summary of
`nsys -- COMMAND`; with `--memory`, the CUDA memory history and the report of `memory -- COMMAND`."""

from __future__ import annotations

from pathlib import Path

import click
from click.core import ParameterSource

from profiler_kit.cli.common import format_option, positive_int
from profiler_kit.cli.memory import MAX_ENTRIES, record_program
from profiler_kit.cli.nsys import NSYS_PATH, REPLACE, nsys_words, program_options, report_program
from profiler_kit.defaults import KERNELS_TOP, MEMORY_TOP
from profiler_kit.names import MEMORY_REPORT_TABLES, RECORDING_BACKENDS, SUMMARY_TABLES, report_column

AUTO = "auto"
# The options that shape a kernel recording and its summary, which --memory does not take.
KERNEL_ONLY = ("backend", "nsys_path", "nsys_args", "capture", "phases", "flops_per_step", "peak_tflops")


@click.command("profile", context_settings={"allow_interspersed_args": False},
               short_help="Record any program and show where its time (or memory) goes.")
@click.option("--backend", type=click.Choice((AUTO, *RECORDING_BACKENDS)), default=AUTO, show_default=True,
              help="The recorder: auto picks nsys when it is found and a CUDA device is present, else torch "
                   "(torch.profiler, any machine).")
@NSYS_PATH
@program_options(within="")
@click.option("--memory", is_flag=True,
              help="Record the CUDA memory history instead (needs a GPU) and explain its peak by role, phase "
                   "and step, as `memory -- COMMAND` does; the snapshot goes to memory_snapshots/ unless -o "
                   "says where.")
@MAX_ENTRIES
@REPLACE
@click.option("--top", type=positive_int, default=None,
              help=f"Kernels in the summary [default: {KERNELS_TOP}], or with --memory the largest allocations "
                   f"listed [default: {MEMORY_TOP}].")
@format_option(tables=(*SUMMARY_TABLES, *MEMORY_REPORT_TABLES), columns=report_column)
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="-- COMMAND [ARGS]...")
@click.pass_context
def profile_cmd(ctx: click.Context, backend: str, nsys_path: Path | None, output: Path | None, nsys_args: str,
                capture: bool, phases: tuple[str, ...], flops_per_step: float | None, peak_tflops: float | None,
                modules: str, memory: bool, max_entries: int, force: bool, top: int | None, fmt: str,
                command: tuple[str, ...]) -> None:
    """Record any program as it is and show where its time goes: kernels (on a CPU, operators) by category,
    per phase (forward, backward, optimizer_step, found by the recorder) and per step.

    The recorder is the best one here: Nsight Systems when nsys is found and a CUDA device is present, else
    torch.profiler; one line on stderr says which and why. Each torchrun worker is recorded as its rank. The
    program's output goes to stderr, the summary to stdout; the command exits with the program's exit status.

    \b
    Examples:
      profiler-kit profile -- python train.py --lr 3e-4
      profiler-kit profile -o profiles/ddp -- torchrun --nproc-per-node 2 train.py
      profiler-kit profile --memory -- python train.py

    Then `kernels summarize`, `kernels compare` and `memory summarize` read the files again."""
    if not command:
        raise click.UsageError("give the program to record after `--`, as in "
                               "`profiler-kit profile -- python train.py`", ctx)
    given = [p for p in ctx.command.params if ctx.get_parameter_source(p.name) == ParameterSource.COMMANDLINE]
    if memory:
        kernel_only = [p.opts[0] for p in given if p.name in KERNEL_ONLY]
        if kernel_only:
            raise click.UsageError(f"{', '.join(kernel_only)}: options of a kernel recording, not of --memory", ctx)
        ctx.exit(record_program(list(command), output, max_entries, force, top or MEMORY_TOP, fmt, modules))
    from profiler_kit.recording.runner import choose_recorder, run_program
    from profiler_kit.render import say

    words = nsys_words(nsys_args)
    if backend == AUTO:
        backend, why = choose_recorder(nsys_path)
        say(why)
    run = run_program(list(command), backend, output, nsys_path, words, capture, force, modules=modules)
    ctx.exit(report_program(run, fmt, top or KERNELS_TOP, list(phases) or None, flops_per_step, peak_tflops))


COMMANDS = [profile_cmd]
