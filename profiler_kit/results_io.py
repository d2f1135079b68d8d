"""Sweeps that lose nothing: append-as-you-go result files (.jsonl, .csv, .md), reading them back for `--resume`,
and the loop that runs one config after another.

A sweep writes each row the moment its config finishes, so a crash, an OOM or a Ctrl-C loses nothing that was
measured; `--resume` reads the file back and skips configs whose key columns are already there.
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from profiler_kit.errors import ProfilerKitError, UsageProblem
from profiler_kit.files import check_input, check_output, read_bytes

SUFFIXES = (".jsonl", ".csv", ".md")


def _check_suffix(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise UsageProblem(f"--output {path}: unsupported extension; use one of {', '.join(SUFFIXES)}")
    return suffix


def _md_cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _parse_text(value: str) -> Any:
    """Undo the text encoding of .csv/.md cells: '' → None, numbers → int/float, True/False → bool."""
    if value == "":
        return None
    if value in ("True", "False"):
        return value == "True"
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows already in a result file; an absent file has none. A line that is not a row is an error naming it."""
    path = Path(path)
    suffix = _check_suffix(path)
    if not path.exists() and not path.is_symlink():
        return []
    try:
        text = read_bytes(path).decode("utf-8")
    except UnicodeDecodeError:
        raise ProfilerKitError(f"{path}: binary data, not a results file") from None
    if suffix == ".jsonl":
        return [_json_row(line, number, path) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    if suffix == ".csv":
        try:
            reader = csv.DictReader(text.splitlines())
            rows = [{k: _parse_text(v) for k, v in row.items()} for row in reader]
        except csv.Error as exc:
            raise ProfilerKitError(f"{path}: not a readable CSV ({exc})") from None
        if any(None in row for row in rows):
            raise ProfilerKitError(f"{path}: a row has more cells than the header")
        return rows
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("|")]
    if not lines:
        return []
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = []
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows.append({k: _parse_text(v) for k, v in zip(header, cells, strict=False)})
    return rows


def _json_row(line: str, number: int, path: Path) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ProfilerKitError(f"{path}: line {number} is not valid JSON ({getattr(exc, 'msg', exc)})") from None
    if not isinstance(row, dict):
        raise ProfilerKitError(f"{path}: line {number} is a JSON {type(row).__name__}, not a row (an object)")
    return row


def _file_columns(path: Path, suffix: str) -> list[str]:
    """The columns of an existing result file: its header, or the keys of a .jsonl's rows."""
    if suffix == ".jsonl":
        return list(dict.fromkeys(k for row in read_rows(path) for k in row))
    rows = read_rows(path)
    if rows:
        return list(rows[0].keys())
    head = read_bytes(path).decode("utf-8", errors="replace").strip().splitlines()[:1]
    if suffix == ".csv":
        return next(csv.reader(head), [])
    return [c.strip() for c in head[0].strip().strip("|").split("|")] if head and head[0].startswith("|") else []


def row_key(row: dict[str, Any], key_columns: Sequence[str]) -> tuple[str, ...]:
    """A comparable key, robust to the text round trip of .csv/.md (1 vs '1', True vs 'True', 2.0 vs '2')."""
    return tuple(_key_cell(row.get(c)) for c in key_columns)


def _key_cell(value: Any) -> str:
    parsed = None if value is None else _parse_text(str(value))
    # A float as a .md cell holds it (6 significant digits), so 2.0, '2.0' and '2' compare equal.
    return _md_cell(parsed) if isinstance(parsed, float) else str(parsed)


class RowWriter:
    """Appends rows to `path` (format from the suffix), writing a header when the file is new or empty.

    Checked when made, before any work: the file can be written, and an existing one is a result file with
    these columns, a .csv/.md header holding every one of `key_columns` (a foreign file is refused, not appended
    to: UsageProblem, as an unsupported extension). Each row is appended under an exclusive lock, which also
    decides whether the header is due, so concurrent sweeps never interleave headers or half rows.
    A row that cannot be written (a full disk) is kept in `unwritten`, and the file cut back to its last whole
    row; `check_all_written` then hands those rows to the caller and fails.
    """

    def __init__(self, path: Path, columns: Sequence[str], key_columns: Sequence[str] = ()) -> None:
        self.path = Path(path)
        self.suffix = _check_suffix(self.path)
        check_output(self.path)
        self.columns = list(columns)
        self.unwritten: list[dict[str, Any]] = []
        self.error: OSError | None = None
        if self.path.exists() or self.path.is_symlink():
            if check_input(self.path):
                found = _file_columns(self.path, self.suffix)
                extra = [c for c in found if c not in self.columns]
                if extra or not found:
                    raise UsageProblem(
                        f"{self.path}: not a results file of this command (its columns: "
                        f"{', '.join(found[:8]) or 'none'}{', ...' if len(found) > 8 else ''}); refused rather than "
                        "appended to: give a new --output"
                    )
                # Keep an existing file's column order so appended rows line up with its header.
                if self.suffix != ".jsonl":
                    missing = [c for c in key_columns if c not in found]
                    if missing:
                        raise UsageProblem(
                            f"{self.path}: its header lacks the key column(s) {', '.join(missing)}, which rows "
                            "appended to it would lose; refused rather than appended to: give a new --output"
                        )
                    self.columns = found

    def append(self, row: dict[str, Any]) -> None:
        try:
            with self.path.open("ab", buffering=0) as fh:
                fcntl.flock(fh, fcntl.LOCK_EX)
                end = fh.seek(0, os.SEEK_END)
                try:
                    _write_all(fh, self._text(row, header=end == 0).encode())
                except OSError:
                    fh.truncate(end)
                    raise
        except OSError as exc:
            self.error = exc
            self.unwritten.append(row)

    def _text(self, row: dict[str, Any], header: bool) -> str:
        if self.suffix == ".jsonl":
            return _json_line(row) + "\n"
        if self.suffix == ".csv":
            buffer = io.StringIO()
            writer = csv.DictWriter(buffer, fieldnames=self.columns, extrasaction="ignore")
            if header:
                writer.writeheader()
            writer.writerow({k: row.get(k) for k in self.columns})
            return buffer.getvalue()
        lines = []
        if header:
            lines += ["| " + " | ".join(self.columns) + " |", "|" + "|".join("---" for _ in self.columns) + "|"]
        lines.append("| " + " | ".join(_md_cell(row.get(k)) for k in self.columns) + " |")
        return "\n".join(lines) + "\n"

    def check_all_written(self, echo: Callable[[str], None]) -> None:
        """Hand every row that could not be written to `echo` as a JSON line, then fail saying where they could
        not go; nothing when all rows were written."""
        if not self.unwritten:
            return
        for row in self.unwritten:
            echo(_json_line(row))
        reason = self.error.strerror or str(self.error) if self.error else "unknown"
        raise ProfilerKitError(
            f"{len(self.unwritten)} row(s) could not be written to {self.path} ({reason}); they are printed above "
            "as JSON lines"
        )


def _write_all(fh: Any, data: bytes) -> None:
    """An unbuffered write may take only part of the data; write the rest."""
    view = memoryview(data)
    while view:
        view = view[fh.write(view):]


def _json_line(row: dict[str, Any]) -> str:
    return json.dumps({k: _json_safe(v) for k, v in row.items()})


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class SweepConfig(Protocol):
    def as_dict(self) -> dict[str, Any]: ...


C = TypeVar("C", bound=SweepConfig)
G = TypeVar("G")


def pending(
    configs: Sequence[C],
    done_rows: Iterable[dict[str, Any]],
    key_columns: Sequence[str],
    settings: dict[str, Any] | None = None,
) -> list[C]:
    """Configs without a row among `done_rows` (for --resume). `settings`: the values every row must have
    besides its config's (steps, warm-up, device: whatever changes a measurement without being part of a
    config); a row measured with other settings does not count as done."""
    done = {row_key(row, key_columns) for row in matching(done_rows, settings)}
    return [cfg for cfg in configs if row_key(cfg.as_dict(), key_columns) not in done]


def rows_of(
    configs: Sequence[C],
    rows: Iterable[dict[str, Any]],
    key_columns: Sequence[str],
    settings: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The rows (e.g. read back from a result file) that belong to `configs`, measured with `settings`."""
    keys = {row_key(cfg.as_dict(), key_columns) for cfg in configs}
    return [row for row in matching(rows, settings) if row_key(row, key_columns) in keys]


def matching(rows: Iterable[dict[str, Any]], settings: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The rows whose values of `settings`' columns are those of `settings` (text round trip included)."""
    settings = settings or {}
    wanted = row_key(settings, list(settings))
    return [row for row in rows if row_key(row, list(settings)) == wanted]


def run_sweep(
    groups: Iterable[G],
    run: Callable[[G], Iterable[dict[str, Any]]],
    on_start: Callable[[G], None] | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> Iterator[dict[str, Any]]:
    """Run each group (one config, or configs measured together) in turn, yielding (and handing to `on_row`) each
    row as soon as it exists. `run` must turn its own failures into the row's status: one broken config never
    ends the sweep."""
    for group in groups:
        if on_start:
            on_start(group)
        for row in run(group):
            if on_row:
                on_row(row)
            yield row
