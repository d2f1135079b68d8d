"""The `profiler-kit` command line. Each area registers its commands from its own module; this file only
assembles them and is the one error boundary: every failure reaches the user as one line on stderr and an exit
status (0 done, 1 failed, 2 usage error, 3 internal error, 130 interrupted); `--debug` shows the traceback."""

from __future__ import annotations

import click

from profiler_kit import __version__
from profiler_kit.errors import ProfilerKitError, first_line
from profiler_kit.files import DEFAULT_MAX_INPUT_MB, MIB, InputLimits, set_limits

# Exit status of an unexpected exception (a bug); ProfilerKitError and OS errors exit 1, usage errors 2.
EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 130


class _Failure(click.ClickException):
    """A one-line error with its own exit status."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _failure(exc: Exception) -> _Failure:
    """What the user reads for an exception that escaped a command."""
    if isinstance(exc, ProfilerKitError):
        return _Failure(" ".join(str(exc).split()))
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return _Failure(f"{where}{exc.strerror or first_line(exc)}")
    if isinstance(exc, MemoryError):
        return _Failure("out of memory (an input larger than this machine can hold?); lower --max-input-mb "
                        "or use a machine with more memory")
    return _Failure(f"internal error: {first_line(exc)[:300]} (a bug; rerun with --debug and report the "
                    "traceback)", EXIT_INTERNAL)


class _Group(click.Group):
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
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
@click.version_option(__version__, prog_name="profiler-kit")
@click.option("--debug", is_flag=True, envvar="PROFILER_KIT_DEBUG", expose_value=False, is_eager=True,
              show_envvar=True, callback=_set_debug, help="Show the traceback of a failure (for bug reports).")
@click.option("--max-input-mb", type=click.IntRange(min=1), default=DEFAULT_MAX_INPUT_MB, show_default=True,
              expose_value=False, callback=_set_max_input,
              help="The most an input file (decompressed) may put in memory.")
def main() -> None:
    """Where the time and memory of a Transformer LM training step go on an NVIDIA GPU."""


def _register() -> None:
    from profiler_kit.cli import attention, benchmark, kernels, memory, models, nsys

    for module in (benchmark, models, kernels, nsys, memory, attention):
        for command in module.COMMANDS:
            main.add_command(command)


_register()
