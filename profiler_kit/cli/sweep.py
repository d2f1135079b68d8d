"""The sweep loop of the measuring commands: skip what `--resume` finds in `--output`, append each row as it
comes, and show progress without a refresh thread (the display redraws between measurements, never during one,
so it takes no host time from a timed step)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from profiler_kit.render import console_err, literal, say
from profiler_kit.results_io import RowWriter, SweepConfig, pending, read_rows, rows_of, run_sweep

C = TypeVar("C", bound=SweepConfig)
Status = Callable[[str], None]


def one_at_a_time(items: Sequence[C]) -> Iterable[Sequence[C]]:
    return ([item] for item in items)


def run_with_progress(
    items: Sequence[C],
    run: Callable[[Sequence[C], Status], Iterable[dict[str, Any]]],
    *,
    key_columns: Sequence[str],
    writer: RowWriter | None,
    resume: bool,
    fmt: str,
    title: str,
    describe: Callable[[Sequence[C]], str],
    label: Callable[[dict[str, Any]], str],
    groups: Callable[[Sequence[C]], Iterable[Sequence[C]]] = one_at_a_time,
    settings: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The rows of `items`: those already in the writer's file with `resume` (measured with `settings`), then
    those of the rest, run group by group (`run(group, status)` yields a group's rows; `status(text)` shows what
    it is doing between measurements). Each new row is appended by `writer` the moment it exists (the caller
    checks `writer.check_all_written` once the rows are shown); rows that are not ok are announced on stderr."""
    if resume and writer is None:
        raise click.UsageError("--resume needs --output (the file whose rows are skipped)")
    done = rows_of(items, read_rows(writer.path), key_columns, settings) if resume and writer else []
    todo = pending(items, done, key_columns) if resume else list(items)
    if done and writer:
        say(f"resume: {len(items) - len(todo)} of {len(items)} configs already in {writer.path}")
    rows = list(done)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console_err, transient=fmt != "table", auto_refresh=False) as progress:
        task = progress.add_task(title, total=len(todo))
        current = [title]

        def status(text: str) -> None:
            progress.update(task, description=f"{current[0]}: {text}")
            progress.refresh()

        def on_start(group: Sequence[C]) -> None:
            current[0] = describe(group)
            progress.update(task, description=current[0])
            progress.refresh()

        def on_row(row: dict[str, Any]) -> None:
            if writer:
                writer.append(row)
            if row["status"] != "ok":
                progress.console.print(Text(literal(f"{label(row)}: {row['status']}: {row['message']}"),
                                            style="yellow"))
            progress.advance(task)
            progress.refresh()

        rows += run_sweep(groups(todo), lambda group: run(group, status), on_start, on_row)
    return rows
