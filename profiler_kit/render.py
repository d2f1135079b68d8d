"""Rendering of analysis DataFrames: rich tables for people, JSON / CSV / Markdown for machines.

Analyses return DataFrames; this module is the only place that turns them into text. Machine formats go to
stdout alone, so `--format json | jq` works; everything meant for a person's eyes (progress, logs) goes to
stderr through `console_err`.
"""

from __future__ import annotations

import io
import json
import math
import sys
from collections.abc import Iterable
from typing import Any, Protocol

import pandas as pd
from rich.console import Console
from rich.table import Table

FORMATS = ("table", "json", "csv", "markdown")

# Piped or redirected output has no terminal width to follow: print wide tables unwrapped instead of squeezing
# them into 80 columns.
PIPE_WIDTH = 240
console_out = Console(soft_wrap=False, width=None if sys.stdout.isatty() else PIPE_WIDTH)
console_err = Console(stderr=True)


def json_safe(value: Any) -> Any:
    """A value made JSON-safe: NaN/inf become null, numpy scalars become Python numbers."""
    if value is None:
        return None
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            value = value.item()
        except (ValueError, AttributeError):
            pass
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows of a DataFrame as JSON-safe dicts (NaN → None)."""
    return [{k: json_safe(v) for k, v in row.items()} for row in df.to_dict(orient="records")]


def to_json(obj: Any) -> str:
    if isinstance(obj, pd.DataFrame):
        obj = records(obj)
    return json.dumps(json_safe(obj), indent=2)


def format_cell(value: Any, column: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if column.endswith("_pct") or column.endswith("share"):
            return f"{value:.1f}"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 100:
            return f"{value:.1f}"
        if abs(value) >= 1:
            return f"{value:.2f}"
        return f"{value:#.3g}"  # '#' keeps trailing zeros: 0.800, not 0.8, beside 1.00
    if isinstance(value, int) and abs(value) >= 10000:
        return f"{value:,}"
    return str(value)


def to_markdown(df: pd.DataFrame, title: str | None = None) -> str:
    cols = [str(c) for c in df.columns]
    lines = []
    if title:
        lines += [f"### {title}", ""]
    lines.append("| " + " | ".join(cols) + " |")
    lines.append(
        "|" + "|".join("---:" if pd.api.types.is_numeric_dtype(df[c]) else "---" for c in df.columns) + "|"
    )
    for row in df.itertuples(index=False):
        lines.append(
            "| " + " | ".join(format_cell(v, c).replace("|", "\\|") for v, c in zip(row, cols, strict=True)) + " |"
        )
    return "\n".join(lines) + "\n"


def to_csv(df: pd.DataFrame) -> str:
    buf = io.StringIO()
    df.to_csv(buf, index=False)
    return buf.getvalue()


def rich_table(df: pd.DataFrame, title: str | None = None, caption: str | None = None) -> Table:
    table = Table(title=title, caption=caption, header_style="bold")
    for col in df.columns:
        numeric = pd.api.types.is_numeric_dtype(df[col]) and not pd.api.types.is_bool_dtype(df[col])
        table.add_column(str(col), justify="right" if numeric else "left")
    for row in df.itertuples(index=False):
        table.add_row(*(format_cell(v, str(c)) for v, c in zip(row, df.columns, strict=True)))
    return table


def emit_tables(
    tables: Iterable[tuple[str, pd.DataFrame]],
    fmt: str,
    json_obj: Any = None,
    caption: str | None = None,
) -> None:
    """Print titled tables in `fmt`.

    json: `json_obj` when given (an object gains `schema_version` and `environment`), else one table's rows as
    an array, or title → rows for several.
    csv: several tables are separated by a blank line and a `# title` comment."""
    tables = list(tables)
    if fmt == "json":
        if isinstance(json_obj, dict):
            from profiler_kit.environment import envelope

            obj = envelope(json_obj)
        elif json_obj is not None:
            obj = json_obj
        elif len(tables) == 1:
            obj = records(tables[0][1])
        else:
            obj = {title: records(df) for title, df in tables}
        sys.stdout.write(to_json(obj) + "\n")
    elif fmt == "csv":
        parts = []
        for title, df in tables:
            parts.append((f"# {title}\n" if len(tables) > 1 else "") + to_csv(df))
        sys.stdout.write("\n".join(parts))
    elif fmt == "markdown":
        sys.stdout.write(
            "\n".join(to_markdown(df, title if len(tables) > 1 else None) for title, df in tables)
        )
        if caption:
            sys.stdout.write(f"\n_{caption}_\n")
    elif fmt == "table":
        for i, (title, df) in enumerate(tables):
            console_out.print(rich_table(df, title=title, caption=caption if i == len(tables) - 1 else None))
    else:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")


class Report(Protocol):
    """An analysis result that `emit_report` prints: titled tables, a caption, the JSON contract and notes."""

    notes: list[str]

    def tables(self, display: bool = False) -> list[tuple[str, pd.DataFrame]]: ...

    def caption(self) -> str: ...

    def to_json(self) -> dict[str, Any]: ...


def emit_report(report: Report, fmt: str) -> None:
    """Print `report` in `fmt`. The table format shows shortened names (`display`) and has the notes in its
    caption; the machine formats print the notes on stderr, so stdout holds only the document."""
    if fmt != "table":
        for note in report.notes:
            console_err.print(f"note: {note}", soft_wrap=True)
    emit_tables(
        report.tables(display=fmt == "table"),
        fmt,
        json_obj=report.to_json() if fmt == "json" else None,
        caption=report.caption(),
    )
