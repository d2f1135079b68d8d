"""Rendering of analysis DataFrames: rich tables for people, JSON / CSV / Markdown for machines.

Analyses return DataFrames; this module is the only place that turns them into text. Machine formats go to
stdout alone, so `--format json | jq` works; everything meant for a person's eyes (progress, logs) goes to
stderr through `console_err`. pandas and rich are imported when something is rendered, not with this module,
so that every `--help` starts without them.
"""

from __future__ import annotations

import functools
import io
import json
import math
import os
import re
import shutil
import sys
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from profiler_kit.errors import literal

if TYPE_CHECKING:
    import pandas as pd
    from rich.console import Console
    from rich.table import Table

FORMATS = ("table", "json", "csv", "markdown", "md")
# Width of a table when stdout is no terminal and COLUMNS is unset.
DEFAULT_WIDTH = 120
# A text column squeezed to fit keeps at least this many characters (or its header's length).
MIN_TEXT_WIDTH = 24
# Optional columns give way before a text column is squeezed below this many characters.
COMFORTABLE_TEXT_WIDTH = 40
# A cell without a value.
MISSING = "–"
# Continuation lines of a wrapped note start with this.
NOTE_INDENT = "  "
_MARKDOWN_SPECIAL = re.compile(r"([\\`|<>])")
# A word of a title that is a number (`Top 8 kernels`, `largest 5 allocations`): left out of the table's name.
_NUMBER_WORD = re.compile(r"^[0-9]+$")


@functools.cache
def _console(stderr: bool) -> Console:
    """The console for stdout or stderr, made on first use. Neither reads rich markup: what they print may hold
    names and paths from data."""
    from rich.console import Console

    if stderr:
        return Console(stderr=True, markup=False, highlight=False)
    return Console(soft_wrap=False, markup=False, highlight=False)


def __getattr__(name: str) -> Any:
    """`console_out` and `console_err`, rich consoles made when first asked for."""
    if name in ("console_out", "console_err"):
        return _console(name == "console_err")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def say(message: str) -> None:
    """One line for a person on stderr, printed literally (no rich markup, control characters escaped)."""
    from rich.text import Text

    _console(True).print(Text(literal(message)), soft_wrap=True)


def output_width() -> int:
    """The columns a table may take: the terminal's, else `COLUMNS`, else DEFAULT_WIDTH."""
    if sys.stdout.isatty():
        return shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns
    try:
        return max(int(os.environ.get("COLUMNS", "")), 20)
    except ValueError:
        return DEFAULT_WIDTH


class OutputFormat(str):
    """A `--format` value (compares equal to its name) with the options that shape it: `columns` and `wide` for
    people's formats, `table` (which table CSV prints) and `csv_dir` (where every table goes as a CSV, whatever
    the format)."""

    columns: tuple[str, ...] = ()
    wide: bool = False
    table: str | None = None
    csv_dir: Path | None = None

    def __new__(cls, name: str, **options: Any) -> OutputFormat:
        self = super().__new__(cls, "markdown" if name == "md" else name)
        for key, value in options.items():
            setattr(self, key, value)
        return self


class Title(str):
    """A table's title (compares equal to its text) with the table's stable `name` (`--table`, the file names of
    `--csv-dir`, the keys of a JSON made of tables), the same whatever the options and the source; its `key`
    columns: a table narrowed to the output width drops its other columns first; and its `prose` columns, text
    in words, which a narrowed table cuts at the end of a word rather than in the middle."""

    name: str | None = None
    key: tuple[str, ...] = ()
    prose: tuple[str, ...] = ()

    def __new__(cls, text: str, name: str | None = None, key: Sequence[str] = (), prose: Sequence[str] = ()) -> Title:
        self = super().__new__(cls, text)
        self.name, self.key, self.prose = name, tuple(key), tuple(prose)
        return self


@dataclass
class Shown:
    """A table with the columns it shows by default; --wide shows all, --columns picks, JSON and CSV keep all.
    `more`: further columns of the same rows (a table that is a column group of a larger one), which --columns
    picks from too when no table has all of its columns."""

    frame: pd.DataFrame
    default: Sequence[str]
    more: pd.DataFrame | None = None


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
    import pandas as pd

    if isinstance(obj, pd.DataFrame):
        obj = records(obj)
    return json.dumps(json_safe(obj), indent=2)


def format_count(value: int) -> str:
    """A count as every table and note writes it: thousands separated (`134,912`)."""
    return f"{value:,}"


def format_cell(value: Any, column: str = "") -> str:
    """A cell as a person reads it: separators from 1,000 up in every numeric column, 3 significant digits below 1."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if column.endswith("_pct") or column.endswith("share"):
            return f"{value:,.1f}"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 100:
            return f"{value:.1f}"
        if abs(value) >= 1:
            return f"{value:.2f}"
        return f"{value:#.3g}"  # '#' keeps trailing zeros: 0.800, not 0.8, beside 1.00
    if isinstance(value, int):
        return format_count(value)
    return literal(value)


def shorten_middle(text: str, width: int, head: int | None = None) -> str:
    """`text` cut to `width` characters once, with `…` where the cut is: `head` characters from its start, the rest
    from its end; by default two thirds from its start (where a kernel's name says what it computes), one third
    from its end."""
    if len(text) <= width:
        return text
    if head is None:
        head = -(-2 * (width - 1) // 3)
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]


def shorten_words(text: str, width: int) -> str:
    """`text` (words) cut to at most `width` characters at the end of a word, `…` after it; a first word longer
    than that is cut within."""
    if len(text) <= width:
        return text
    kept = text[:width - 1]
    end = kept.rfind(" ") if text[width - 1] != " " else width - 1
    if end > 0:
        kept = kept[:end]
    return kept.rstrip(" ,;:") + "…"


def shorten_distinct(texts: Sequence[str], width: int) -> list[str]:
    """Each of `texts` cut in its middle to `width` (`shorten_middle`). Where several different texts would read
    the same, their cut moves, for all of them alike, to the place nearest the usual one that tells them apart,
    keeping at least a third of the width from their start; where no single cut does (they differ deep inside,
    as a kernel's template arguments do), each keeps its first third, then, after `…`, what follows the start
    they share, cut again with `…` where the width ends."""
    cut = [shorten_middle(t, width) for t in texts]
    groups: dict[str, set[str]] = {}
    for text, short in zip(texts, cut, strict=True):
        groups.setdefault(short, set()).add(text)
    usual = -(-2 * (width - 1) // 3)
    least = max(1, (width - 2) // 3)
    for short, originals in groups.items():
        if len(originals) < 2 or width < 6:
            continue
        heads = sorted(range(least, width - 1), key=lambda h: (abs(h - usual), h))
        head = next((h for h in heads if len({shorten_middle(t, width, h) for t in originals}) == len(originals)),
                    None)
        if head is not None:
            apart = {t: shorten_middle(t, width, head) for t in originals}
        else:
            shared = max(len(os.path.commonprefix(list(originals))), least)
            window = width - 2 - least
            apart = {t: t[:least] + "…" + (t[shared:] if len(t) - shared <= window + 1 else t[shared:shared + window]
                                            + "…") for t in originals}
        cut = [apart[t] if c == short else c for t, c in zip(texts, cut, strict=True)]
    return cut


def _markdown_cell(text: str) -> str:
    return _MARKDOWN_SPECIAL.sub(r"\\\1", literal(text))


def to_markdown(df: pd.DataFrame, title: str | None = None) -> str:
    """A GitHub Markdown table; text from data is escaped (`|`, `<`, `>`, backticks, newlines) so it shows as is."""
    import pandas as pd

    cols = [str(c) for c in df.columns]
    lines = []
    if title:
        lines += [f"### {_markdown_cell(title)}", ""]
    lines.append("| " + " | ".join(map(_markdown_cell, cols)) + " |")
    lines.append(
        "|" + "|".join("---:" if pd.api.types.is_numeric_dtype(df[c]) else "---" for c in df.columns) + "|"
    )
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(_markdown_cell(format_cell(v, c)) for v, c in zip(row, cols, strict=True))
                     + " |")
    return "\n".join(lines) + "\n"


def to_csv(df: pd.DataFrame) -> str:
    buf = io.StringIO()
    df.to_csv(buf, index=False)
    return buf.getvalue()


def _numeric(column: pd.Series) -> bool:
    import pandas as pd

    return pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column)


def _cells(df: pd.DataFrame) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame({str(c): [format_cell(v, str(c)) for v in df[c]] for c in df.columns}, index=df.index)


def header_lines(name: str, width: int) -> str:
    """A column's name on lines of at most `width` characters, broken after its underscores (`collective_` over
    `calls`): joined again, the lines give the name back; a piece longer than `width` stays whole."""
    pieces = re.findall(r"[^_]*_|[^_]+$", name) or [name]
    lines = [""]
    for piece in pieces:
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines.append("")
        lines[-1] += piece
    return "\n".join(lines)


@dataclass
class Fitted:
    """A table's text cells as they fit a width, its headers (perhaps on several lines, `header_lines`), and
    what it leaves out: each column's name, with its value when it is the same in every row."""

    cells: pd.DataFrame
    headers: dict[str, str]
    dropped: list[str]


def fit_columns(df: pd.DataFrame, width: int, key: Sequence[str] = (), prose: Sequence[str] = ()) -> Fitted:
    """`df` as text cells that fit `width` columns of a boxed table.

    Columns other than the first and the `key` ones go first, those with one value in every row before the
    others, rightmost first, while the table would not fit with its text columns at COMFORTABLE_TEXT_WIDTH. If
    it still would not, headers are broken after their underscores, the ones that gain most first; then key
    columns (never the first) go, in the same order, until it fits with its text columns at MIN_TEXT_WIDTH.
    Then text columns are shortened once, the widest first, to what the width leaves (MIN_TEXT_WIDTH at least,
    or their header's width): `prose` columns at the end of a word, the others in their middle, where texts
    that would read alike keep the part that tells them apart (`shorten_distinct`)."""
    cells = _cells(df)
    text = {str(c) for c in df.columns if not _numeric(df[c])}
    columns = list(cells.columns)
    keep = {columns[0], *key} if columns else set(key)
    content = {c: max(map(len, cells[c]), default=0) for c in columns}
    headers = {c: c for c in columns}
    constant = {c for c in columns if len(cells) > 1 and cells[c].nunique() == 1}

    def head(c: str) -> int:
        return max(map(len, headers[c].split("\n")))

    def total(limit: int) -> int:
        widths = [max(min(content[c], limit) if c in text else content[c], head(c)) for c in columns]
        return sum(widths) + 3 * len(columns) + 1

    def drop_until_fits(limit: int, may_go: Callable[[str], bool]) -> None:
        while total(limit) > width:
            candidates = [c for c in columns[1:] if may_go(c)]
            if not candidates:
                return
            columns.remove(([c for c in candidates if c in constant] or candidates)[-1])

    drop_until_fits(COMFORTABLE_TEXT_WIDTH, lambda c: c not in keep)
    gains = {c: head(c) - max(max(map(len, header_lines(c, 1).split("\n"))),
                               min(content[c], MIN_TEXT_WIDTH) if c in text else content[c]) for c in columns}
    for column in sorted((c for c in columns if gains[c] > 0), key=lambda c: -gains[c]):
        if total(MIN_TEXT_WIDTH) <= width:
            break
        headers[column] = header_lines(column, head(column) - gains[column])
    drop_until_fits(MIN_TEXT_WIDTH, lambda c: True)
    widths = {c: max(content[c], head(c)) for c in columns}
    for column in sorted((c for c in columns if c in text), key=lambda c: -widths[c]):
        over = sum(widths.values()) + 3 * len(columns) + 1 - width
        if over <= 0:
            break
        widths[column] = max(widths[column] - over, min(content[column], MIN_TEXT_WIDTH), head(column))
        values = list(cells[column])
        cells[column] = ([shorten_words(v, widths[column]) for v in values] if column in prose
                         else shorten_distinct(values, widths[column]))
    dropped = [c if c not in constant else f"{c} (empty)" if cells[c].iloc[0] == MISSING
               else f"{c} ({cells[c].iloc[0]} in every row)" for c in cells.columns if c not in columns]
    return Fitted(cells[columns], {c: headers[c] for c in columns}, dropped)


def rich_table(df: pd.DataFrame, width: int | None = None, key: Sequence[str] = (),
               prose: Sequence[str] = ()) -> tuple[Table, list[str]]:
    """A boxed table of `df` that fits `width` (None: any width), and the columns left out to fit; every cell is
    printed literally, never as rich markup."""
    from rich.table import Table
    from rich.text import Text

    fitted = fit_columns(df, width, key, prose) if width else Fitted(_cells(df), {str(c): str(c) for c in df}, [])
    table = Table(header_style="bold")
    for col in fitted.cells.columns:
        table.add_column(Text(fitted.headers[col]), justify="right" if _numeric(df[col]) else "left", no_wrap=True)
    for row in fitted.cells.itertuples(index=False):
        table.add_row(*(Text(v) for v in row))
    return table, fitted.dropped


def wrap_note(line: str, width: int | None) -> str:
    """A note line, left-aligned and wrapped at word boundaries to `width` (None: one line), continuation lines
    indented; a word longer than a line is broken."""
    line = literal(line)
    if width is None:
        return line
    return textwrap.fill(line, width, subsequent_indent=NOTE_INDENT, break_on_hyphens=False) or line


def table_name(title: str) -> str:
    """A table's name (`--table`, CSV file names): the Title's own name, else the title's words before any `(` or
    `:`, less those that are numbers (so that `--top` leaves it as it is)."""
    name = getattr(title, "name", None)
    if name:
        return name
    head = re.split(r"[(:]", title, maxsplit=1)[0]
    words = [w for w in re.findall(r"[a-z0-9]+", head.lower()) if not _NUMBER_WORD.match(w)]
    return "_".join(words) or "table"


def _pick(tables: list[tuple[str, pd.DataFrame]], wanted: str | None) -> pd.DataFrame:
    """The table CSV prints: the first, or the one `wanted` names (its name, a unique start of it, or 1-based)."""
    if wanted is None:
        return tables[0][1]
    names = [table_name(title) for title, _ in tables]
    if wanted.isdigit() and 1 <= int(wanted) <= len(tables):
        return tables[int(wanted) - 1][1]
    matches = [i for i, name in enumerate(names) if name == wanted] or \
        [i for i, name in enumerate(names) if name.startswith(wanted)]
    if len(matches) != 1:
        from click import UsageError

        raise UsageError(f"--table {wanted!r}: this report has no such table; choose one of {', '.join(names)} "
                         f"(or 1-{len(names)})")
    return tables[matches[0]][1]


def _write_csv_dir(tables: list[tuple[str, pd.DataFrame]], folder: Path) -> None:
    from profiler_kit.files import replaced_when_complete

    folder.mkdir(parents=True, exist_ok=True)
    seen: dict[str, int] = {}
    for title, df in tables:
        name = table_name(title)
        seen[name] = seen.get(name, 0) + 1
        path = folder / f"{name}{'' if seen[name] == 1 else seen[name]}.csv"
        with replaced_when_complete(path) as tmp:
            tmp.write_text(to_csv(df))
        say(f"wrote {path}")


def _shown(frame: pd.DataFrame | Shown, fmt: str, own: bool = True) -> pd.DataFrame:
    """The columns a format shows: every one for machines and --wide, the --columns a table has all of (of its
    `more` too, unless some table has all of them itself: `own`), else the table's default."""
    df, default = (frame.frame, list(frame.default)) if isinstance(frame, Shown) else (frame, list(frame.columns))
    columns = list(getattr(fmt, "columns", ()))
    if fmt in ("json", "csv") or getattr(fmt, "wide", False):
        return df
    if columns and set(columns) <= set(df.columns):
        return df[columns]
    more = frame.more if isinstance(frame, Shown) else None
    if columns and not own and more is not None and set(columns) <= set(df.columns) | set(more.columns):
        return df.join(more.drop(columns=[c for c in more.columns if c in df.columns]))[columns]
    return df[default]


def _columns_of(frame: pd.DataFrame | Shown, more: bool = False) -> list[str]:
    """The columns of a table, in order (then those it may show from `more`)."""
    if not isinstance(frame, Shown):
        return list(frame.columns)
    extra = list(frame.more.columns) if more and frame.more is not None else []
    return list(dict.fromkeys([*frame.frame.columns, *extra]))


def _own_columns(frames: list[pd.DataFrame | Shown], fmt: str) -> bool:
    """Whether some table has every column --columns names among its own."""
    columns = set(getattr(fmt, "columns", ()))
    return any(columns <= set(_columns_of(frame)) for frame in frames)


def _check_columns(frames: list[pd.DataFrame | Shown], fmt: str) -> None:
    """A usage error when no table has every column --columns names."""
    columns = set(getattr(fmt, "columns", ()))
    if not columns or fmt in ("json", "csv"):
        return
    names = [_columns_of(frame, more=True) for frame in frames]
    if names and not any(columns <= set(n) for n in names):
        from click import UsageError

        known = ", ".join(dict.fromkeys(str(c) for n in names for c in n))
        raise UsageError(f"--columns: no table has all of {', '.join(sorted(columns))}; columns: {known}")


def _check_output(tables: list[tuple[str, pd.DataFrame | Shown]], fmt: str) -> None:
    """A usage error, before anything is printed, when --columns names columns no table has or --table names no
    table there is."""
    _check_columns([frame for _, frame in tables], fmt)
    if fmt == "csv" and tables:
        _pick([(title, _shown(frame, "csv")) for title, frame in tables], getattr(fmt, "table", None))


def emit_tables(
    tables: Iterable[tuple[str, pd.DataFrame | Shown]],
    fmt: str,
    json_obj: Any = None,
    caption: str | None = None,
) -> None:
    """Print titled tables in `fmt` (a name or an OutputFormat).

    json: `json_obj` when given (an object gains `schema_version` and `environment`), else an object with each
    table's rows under its `table_name`. csv: exactly one table (the first, or the OutputFormat's `table`).
    table: each fits the output width, the columns left out and the caption's lines written below as notes,
    wrapped at word boundaries. In every format, the OutputFormat's `csv_dir` also gets each table, every column,
    as `<table_name>.csv`."""
    tables = list(tables)
    _check_output(tables, fmt)
    if getattr(fmt, "csv_dir", None) is not None:
        _write_csv_dir([(title, _shown(frame, "csv")) for title, frame in tables], fmt.csv_dir)
    own = _own_columns([frame for _, frame in tables], fmt)
    tables = [(title, _shown(frame, fmt, own)) for title, frame in tables]
    if fmt == "json":
        from profiler_kit.environment import envelope

        if json_obj is None:
            json_obj = {table_name(title): records(df) for title, df in tables}
        sys.stdout.write(to_json(envelope(json_obj) if isinstance(json_obj, dict) else json_obj) + "\n")
    elif fmt == "csv":
        if tables:
            sys.stdout.write(to_csv(_pick(tables, getattr(fmt, "table", None))))
    elif fmt in ("markdown", "md"):
        sys.stdout.write(
            "\n".join(to_markdown(df, title if len(tables) > 1 else None) for title, df in tables)
        )
        if caption:
            sys.stdout.write("\n" + "\n".join(f"_{_markdown_cell(line)}_" for line in caption.split("\n")) + "\n")
    elif fmt == "table":
        _print_tables(tables, None if getattr(fmt, "wide", False) else output_width(), caption)
    else:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")


def _print_tables(tables: list[tuple[str, pd.DataFrame]], width: int | None, caption: str | None) -> None:
    """Each title, wrapped at `width` between words, above its boxed table fitted to `width` (None: any width),
    followed by the columns it leaves out; then the caption's lines."""
    from rich.text import Text

    console = _console(False)
    console.width = width or 10_000  # --wide: each line as long as its table

    def note(line: str) -> None:
        console.print(Text(wrap_note(line, width)), soft_wrap=True)

    for title, df in tables:
        table, dropped = rich_table(df, width=width, key=getattr(title, "key", ()), prose=getattr(title, "prose", ()))
        if title:
            line = literal(title)
            console.print(Text(textwrap.fill(line, width, break_on_hyphens=False) if width else line,
                               style="table.title"), soft_wrap=True)
        console.print(table)
        if dropped:
            note(f"not shown: {', '.join(dropped)} (--wide or --columns shows them)")
    for line in (caption or "").split("\n"):
        if line:
            note(line)


class Report(Protocol):
    """An analysis result that `emit_report` prints: titled tables (their titles may be `Title`s), a caption, the
    JSON contract and notes."""

    notes: list[str]

    def tables(self, display: bool = False) -> list[tuple[str, pd.DataFrame]]: ...

    def caption(self) -> str: ...

    def to_json(self) -> dict[str, Any]: ...


def emit_report(report: Report, fmt: str) -> None:
    """Print `report` in `fmt`. The table format shows shortened names (`display`) and has the notes in its
    caption; the machine formats print the notes on stderr, so stdout holds only the document."""
    tables = report.tables(display=fmt == "table")
    _check_output(tables, fmt)
    if fmt != "table":
        for note in report.notes:
            say(f"note: {note}")
    emit_tables(
        tables,
        fmt,
        json_obj=report.to_json() if fmt == "json" else None,
        caption=report.caption(),
    )
