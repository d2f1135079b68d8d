"""The `profiler-kit` command line. Each area registers its commands from its own module; this file only
assembles them and is the one error boundary: every failure reaches the user as one line on stderr and an exit
status (0 done, 1 failed while working or missing a tool, a GPU or an input, 2 refused before any work, 3 internal
error, 130 interrupted; README "Exit codes and errors"); `--debug` shows the traceback."""

from __future__ import annotations

import importlib

import click

from profiler_kit.environment import VERSION
from profiler_kit.errors import ProfilerKitError, UsageProblem, first_line, literal
from profiler_kit.files import DEFAULT_MAX_INPUT_MB, MIB, InputLimits, set_limits

# Exit status of an unexpected exception (a bug); ProfilerKitError and OS errors exit 1, usage errors and
# UsageProblem 2.
EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 130


class _Failure(click.ClickException):
    """A one-line error with its own exit status."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(literal(message))
        self.exit_code = exit_code


def _failure(exc: Exception) -> _Failure:
    """What the user reads for an exception that escaped a command."""
    if isinstance(exc, ProfilerKitError):
        return _Failure(" ".join(str(exc).split()), 2 if isinstance(exc, UsageProblem) else 1)
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return _Failure(f"{where}{exc.strerror or first_line(exc)}")
    if isinstance(exc, MemoryError):
        return _Failure("out of memory (an input larger than this machine can hold?); lower --max-input-mb "
                        "or use a machine with more memory")
    return _Failure(f"internal error: {first_line(exc)[:300]} (a bug; rerun with --debug and report the "
                    "traceback)", EXIT_INTERNAL)


# Each top-level command and the module under profiler_kit.cli that defines it. A module is imported only when its
# command runs or shows its own help, so that `--help`, `--version` and the report readers start without torch.
COMMANDS = {
    "attention": "attention",
    "benchmark": "benchmark",
    "kernels": "kernels",
    "memory": "memory",
    "models": "models",
    "nsys": "nsys",
    "precision": "models",
    "profile": "profile",
}

# What `profiler-kit --help` lists: the commands by the question they answer, each entry the words that run it
# and one line.
QUESTIONS = (
    ("My program is slow: where does the time go?", (
        ("profile -- CMD", "Record any program: time by category, phase and step."),
        ("kernels summarize", "Read a recording again (nsys, torch traces; ranks)."),
        ("kernels whatif", "Predict each phase if some kernels ran faster (GPU)."),
        ("kernels timeline", "The attributed timeline, for ui.perfetto.dev."),
    )),
    ("It runs out of memory: what holds it at the peak?", (
        ("profile --memory", "Record any program's CUDA memory; explain its peak."),
        ("memory summarize", "Explain a CUDA memory snapshot by role, phase, step."),
    )),
    ("Did my change help?", (
        ("kernels compare", "Two recordings, or runs of each: what moved, past noise."),
        ("memory compare", "Two snapshots: peaks, phases and roles side by side."),
    )),
    ("Which attention kernel is fastest?", (
        ("attention", "Implementations side by side: time, TFLOP/s, memory."),
    )),
    ("The built-in Transformer LM", (
        ("benchmark", "Time its phases over models, ctx, modes, optimizers."),
        ("nsys", "Profile one of its configs (any program: as profile)."),
        ("memory", "Record one config's CUDA memory history, explained."),
        ("models", "The presets with exact parameter counts."),
        ("precision", "fp16 accumulation; the dtypes under bf16 autocast."),
    )),
)


class _Group(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module = importlib.import_module(f"profiler_kit.cli.{COMMANDS[name]}")
        return next(command for command in module.COMMANDS if command.name == name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """QUESTIONS, each question over its entries, the entries of every question aligned alike."""
        width = max(len(words) for _question, entries in QUESTIONS for words, _line in entries)
        with formatter.section("Commands, by the question they answer"):
            for question, entries in QUESTIONS:
                formatter.write_paragraph()
                formatter.write_text(question)
                with formatter.indentation():
                    formatter.write_dl([(words.ljust(width), line) for words, line in entries])

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.Abort):
            raise
        except click.ClickException as exc:
            exc.message = literal(exc.message)  # a usage error may quote a path or name from the command line
            raise
        except KeyboardInterrupt:
            if ctx.meta.get("debug"):
                raise
            raise _Failure("interrupted", EXIT_INTERRUPTED) from None
        except Exception as exc:
            if ctx.meta.get("debug"):
                raise
            raise _failure(exc) from None


def _set_debug(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    ctx.meta["debug"] = value
    return value


def _set_max_input(_ctx: click.Context, _param: click.Parameter, value: int) -> int:
    set_limits(InputLimits(max_bytes=value * MIB))
    return value


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(VERSION, prog_name="profiler-kit")
@click.option("--debug", is_flag=True, envvar="PROFILER_KIT_DEBUG", expose_value=False, is_eager=True,
              show_envvar=True, callback=_set_debug, help="Show the traceback of a failure (for bug reports).")
@click.option("--max-input-mb", type=click.IntRange(min=1), default=DEFAULT_MAX_INPUT_MB, show_default=True,
              expose_value=False, callback=_set_max_input,
              help="The most an input file (decompressed) may put in memory.")
def main() -> None:
    """Where the time and memory of a PyTorch program go, which part is responsible, and what to change. Start
    with your own program, as it is (any machine; a GPU with Nsight Systems records the most):

    \b
      profiler-kit profile -- python train.py

    Each command's --help has the details."""
