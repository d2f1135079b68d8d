"""`profiler-kit nsys` (one workload config) and `profiler-kit nsys attention` (one attention shape): record
under Nsight Systems, or with torch.profiler (`--backend torch`), then print the kernel summary."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click
from click.core import ParameterSource

from profiler_kit.cli.attention import dtype_names, impl_names
from profiler_kit.cli.common import (
    comma_list,
    format_option,
    non_negative_int,
    one_of,
    positive_int,
    single,
    workload_options,
)
from profiler_kit.profiling import BACKENDS, AttentionProfileConfig, ProfileResult, profile, profile_attention
from profiler_kit.render import console_err, emit_report
from profiler_kit.workload import WorkloadConfig


def _recording_options(fn: Callable) -> Callable:
    """Options of both commands: steps, recorder, where the files go, how the summary is shown."""
    options = [
        click.option("--warmup", type=non_negative_int, default=2, show_default=True,
                     help="Steps run before recording (outside the capture range)."),
        click.option("--steps", type=positive_int, default=1, show_default=True, help="Steps recorded."),
        click.option("--backend", type=click.Choice(BACKENDS), default="nsys", show_default=True,
                     help="nsys: Nsight Systems report + SQLite; torch: torch.profiler trace (.json.gz)."),
        click.option("--nsys", "nsys_path", type=click.Path(path_type=Path),
                     help="The nsys executable (default: $NSYS, PATH, CUDA and Nsight install folders)."),
        click.option("--output-dir", type=click.Path(file_okay=False, path_type=Path),
                     default=Path("profiles"), show_default=True),
        click.option("--top", type=positive_int, default=15, show_default=True,
                     help="Kernels in the summary."),
        format_option(),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


@click.group("nsys", invoke_without_command=True)
@workload_options(sweep=False)
@_recording_options
@click.pass_context
def nsys(click_ctx: click.Context, model: str, ctx: int, mode: str, batch_size: int, mixed_precision: bool,
         compile_: bool, attention: str, device: str, seed: int, nvtx: bool, optimizer: str, warmup: int, steps: int,
         backend: str, nsys_path: Path | None, output_dir: Path, top: int, fmt: str) -> None:
    """Profile one training-step config: kernels per phase, under Nsight Systems or torch.profiler.

    Writes <output-dir>/<model>_ctx<ctx>_<mode>[_bf16].nsys-rep and .sqlite (or .json.gz with --backend
    torch). On a GPU only the profiled steps are recorded (cudaProfilerApi capture range); on a CPU, the
    whole run."""
    if click_ctx.invoked_subcommand is not None:
        # The subcommand has options of its own; any given to the group would be silently ignored.
        given = [p.opts[0] for p in click_ctx.command.params
                 if click_ctx.get_parameter_source(p.name) == ParameterSource.COMMANDLINE]
        if given:
            sub = click_ctx.invoked_subcommand
            raise click.UsageError(f"{', '.join(given)}: options of `nsys` itself; `nsys {sub}` takes "
                                   "its own after its name")
        return
    cfg = WorkloadConfig(model, ctx, mode, batch_size, mixed_precision, compile_, attention, device, seed,
                         nvtx, optimizer)
    result = profile(cfg, warmup, steps, backend, output_dir, nsys_path)
    _report(result, fmt, top)


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
                  output_dir: Path, top: int, fmt: str) -> None:
    """Profile each attention implementation's forward and backward on one shape.

    NVTX ranges: <impl> holding <impl>.forward and <impl>.backward. Implementations that cannot run the shape
    here are skipped with a note. Writes <output-dir>/attention_<dtype>_b<batch>[_h<heads>]_s<seq>_d<d>
    [_causal].nsys-rep and .sqlite (or .json.gz)."""
    from profiler_kit.attention.registry import BENCH_IMPLS

    cfg = AttentionProfileConfig(tuple(impls or BENCH_IMPLS), dtype, causal, batch, heads, seq, d, device)
    result = profile_attention(cfg, warmup, steps, backend, output_dir, nsys_path)
    _report(result, fmt, top)


def _report(result: ProfileResult, fmt: str, top: int) -> None:
    what = {"cudaProfilerApi": "the profiled steps (cudaProfilerApi capture range)",
            "none": "the whole run, warm-up included",
            "torch.profiler": "the profiled steps (torch.profiler)"}
    console_err.print(f"recorded {what[result.capture]} on {result.device}: "
                      + ", ".join(str(p) for p in result.paths), soft_wrap=True)
    print_summary(result, fmt, top)


def print_summary(result: ProfileResult, fmt: str, top: int) -> None:
    """The kernel summary of a recording, by the kernel-summary engine (`profiler_kit.kernels`)."""
    try:
        from profiler_kit.kernels import summarize
    except ModuleNotFoundError as exc:
        if exc.name != "profiler_kit.kernels":
            raise
        console_err.print("[yellow]no kernel summary: profiler_kit.kernels is not part of this checkout yet",
                          soft_wrap=True)
        return
    emit_report(summarize(result.summary_source, top=top, phases=list(result.phases)), fmt)


COMMANDS = [nsys]
