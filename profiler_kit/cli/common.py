"""Option parsing shared by the commands: comma lists, positive integers, the output format."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from profiler_kit.render import FORMATS


def comma_list(kind: Callable[[str], Any] = str, positive: bool = False) -> Callable:
    """A click callback that parses `a,b,c` into a list, checking each item."""

    def parse(ctx: click.Context, param: click.Parameter, value: Any) -> list | None:
        if value is None:
            return None
        if isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        items = [s.strip() for s in str(value).split(",") if s.strip()]
        if not items:
            raise click.BadParameter("needs at least one value")
        out = []
        for item in items:
            try:
                parsed = kind(item)
            except (ValueError, KeyError) as exc:
                raise click.BadParameter(f"{item!r}: {exc}") from None
            if positive and parsed <= 0:
                raise click.BadParameter(f"{item!r} must be positive")
            out.append(parsed)
        return out

    return parse


def format_option(default: str = "table") -> Callable:
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(FORMATS),
        default=default,
        show_default=True,
        help="table for people; json/csv/markdown print only that on stdout.",
    )


positive_int = click.IntRange(min=1)
non_negative_int = click.IntRange(min=0)
