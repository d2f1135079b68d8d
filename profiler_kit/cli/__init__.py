"""The `profiler-kit` command line. Each area registers its commands from its own module; this file only
assembles them and turns library errors into one-line messages with a non-zero exit."""

from __future__ import annotations

import click

from profiler_kit import __version__
from profiler_kit.errors import ProfilerKitError


class _Group(click.Group):
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except ProfilerKitError as exc:
            raise click.ClickException(str(exc)) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="profiler-kit")
def main() -> None:
    """Where the time and memory of a Transformer LM training step go on an NVIDIA GPU."""


def _register() -> None:
    from profiler_kit.cli import attention, benchmark, kernels, memory, models, nsys

    for module in (benchmark, models, kernels, nsys, memory, attention):
        for command in module.COMMANDS:
            main.add_command(command)


_register()
