"""Sweeps that lose nothing: append-as-you-go result files (.jsonl, .csv, .md), reading them back for `--resume`,
and the loop that runs one config after another.

A sweep writes each row the moment its config finishes, so a crash, an OOM or a Ctrl-C loses nothing that was
measured; `--resume` reads the file back and skips configs whose key columns are already there.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from profiler_kit.errors import ProfilerKitError

SUFFIXES = (".jsonl", ".csv", ".md")


def _check_suffix(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise ProfilerKitError(f"--output {path}: unsupported extension; use one of {', '.join(SUFFIXES)}")
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
    """Rows already in a result file; an absent file has none."""
    path = Path(path)
    suffix = _check_suffix(path)
    if not path.exists():
        return []
    text = path.read_text()
    try:
        if suffix == ".jsonl":
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        if suffix == ".csv":
            return [{k: _parse_text(v) for k, v in row.items()} for row in csv.DictReader(text.splitlines())]
    except (json.JSONDecodeError, csv.Error) as exc:
        raise ProfilerKitError(f"cannot read {path} for --resume: {exc}") from None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("|")]
    if not lines:
        return []
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = []
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows.append({k: _parse_text(v) for k, v in zip(header, cells, strict=False)})
    return rows


def row_key(row: dict[str, Any], key_columns: Sequence[str]) -> tuple[str, ...]:
    """A comparable key, robust to the text round trip of .csv/.md (1 vs '1', True vs 'True')."""
    return tuple(str(_parse_text(str(row.get(c))) if row.get(c) is not None else None) for c in key_columns)


class RowWriter:
    """Appends rows to `path` (format from the suffix), writing a header when the file is new or empty."""

    def __init__(self, path: Path, columns: Sequence[str]) -> None:
        self.path = Path(path)
        self.suffix = _check_suffix(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        existing = read_rows(self.path) if self.path.exists() and self.path.stat().st_size else []
        # Keep an existing file's column order so appended rows line up with its header.
        self.columns = list(existing[0].keys()) if existing and self.suffix != ".jsonl" else list(columns)
        self._needs_header = not (self.path.exists() and self.path.stat().st_size)

    def append(self, row: dict[str, Any]) -> None:
        with self.path.open("a", newline="") as fh:
            if self.suffix == ".jsonl":
                fh.write(json.dumps({k: _json_safe(v) for k, v in row.items()}) + "\n")
            elif self.suffix == ".csv":
                writer = csv.DictWriter(fh, fieldnames=self.columns, extrasaction="ignore")
                if self._needs_header:
                    writer.writeheader()
                writer.writerow({k: row.get(k) for k in self.columns})
            else:
                if self._needs_header:
                    fh.write("| " + " | ".join(self.columns) + " |\n")
                    fh.write("|" + "|".join("---" for _ in self.columns) + "|\n")
                fh.write("| " + " | ".join(_md_cell(row.get(k)) for k in self.columns) + " |\n")
        self._needs_header = False

    def extend(self, rows: Iterable[dict[str, Any]]) -> None:
        for row in rows:
            self.append(row)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class SweepConfig(Protocol):
    def as_dict(self) -> dict[str, Any]: ...


C = TypeVar("C", bound=SweepConfig)
G = TypeVar("G")


def pending(configs: Sequence[C], done_rows: Iterable[dict[str, Any]], key_columns: Sequence[str]) -> list[C]:
    """Configs whose key is not among `done_rows` (for --resume)."""
    done = {row_key(row, key_columns) for row in done_rows}
    return [cfg for cfg in configs if row_key(cfg.as_dict(), key_columns) not in done]


def rows_of(configs: Sequence[C], rows: Iterable[dict[str, Any]], key_columns: Sequence[str]) -> list[dict[str, Any]]:
    """The rows (e.g. read back from a result file) that belong to `configs`."""
    keys = {row_key(cfg.as_dict(), key_columns) for cfg in configs}
    return [row for row in rows if row_key(row, key_columns) in keys]


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
