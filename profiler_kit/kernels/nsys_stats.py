"""`nsys stats` output, as CSV (`--format csv`) or as the text table nsys prints by default.

What varies: report names (`gpukernsum` until 2022, `cuda_gpu_kern_sum` since 2023.1), columns (2022 groups
kernels by `GridXYZ`/`BlockXYZ` too, so one name can span several rows), the time unit in the headers
(`Total Time (ns)`, `(us)`, `(ms)`, `(sec)` under `--timeunit`), thousands separators in newer text tables,
and the lines nsys prints before a table ("Processing [...] with [...]...", " ** CUDA GPU Kernel Summary
(cuda_gpu_kern_sum):", "NOTICE: ..."), and byte-order marks an editor or a concatenation leaves at the start of
a line. The text table cuts names to 100 characters, marking the cut with "…". A CSV cut short (inside a quoted
name, or in its last row) is an error, not a shorter summary.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from profiler_kit.errors import ProfilerKitError
from profiler_kit.kernels.trace import KernelTrace, checked_total, kernel_frame

KERNEL_REPORTS = ("cuda_gpu_kern_sum", "gpukernsum", "cuda_gpu_kern_gb_sum")
NVTX_KERNEL_REPORTS = ("nvtx_kern_sum", "nvtxkernsum")
# Nanoseconds per unit, for the units `nsys stats --timeunit` writes into column headers.
NS_PER_UNIT = {
    "ns": 1,
    "nsec": 1,
    "us": 1_000,
    "usec": 1_000,
    "ms": 1_000_000,
    "msec": 1_000_000,
    "s": 1_000_000_000,
    "sec": 1_000_000_000,
}
TRUNCATION_MARK = "…"
# Integers summed as int64 nanoseconds stay below this (2^62 leaves room for sums of many rows).
MAX_NS = 2.0**62

_SECTION = re.compile(r"^\s*\*\*\s*(?P<title>.*?)\s*\((?P<report>[\w:-]+)\):\s*$")
_CSV_HEADER = re.compile(r"^\"?(Time ?\(%\)|NVTX Range|Total Time|Range|Operation|Name|Start)\"?(,|\s\()")
_DASH_RULE = re.compile(r"^\s*-{2,}(\s+-{2,})*\s*$")
_PLUS_RULE = re.compile(r"^\s*\+-[-+]*\+\s*$")
_TIME_COLUMN = re.compile(r"^(?P<what>.+?)\s*\((?P<unit>[a-z]+)\)$")
_SKIPPED = re.compile(r"^SKIPPED:.*does not contain CUDA kernel data", re.MULTILINE)
BOM = "\ufeff"


@dataclass
class StatsTable:
    """One table of `nsys stats` output: the report name when nsys printed it, and the cells as text."""

    report: str | None
    frame: pd.DataFrame
    fmt: str  # "csv" or "text"


def _lines(text: str) -> list[str]:
    """The lines of the output, without byte-order marks at their starts."""
    return [line.lstrip(BOM) for line in text.splitlines()]


def looks_like_stats(text: str) -> bool:
    return _SKIPPED.search(text) is not None or _find_table(_lines(text)) is not None


def read_stats_table(text: str) -> StatsTable:
    """The kernel-summary table when the output holds several reports, else its only table."""
    sections = _sections(text)
    wanted = next((s for s in sections if s[0] in KERNEL_REPORTS), None) or sections[0]
    report, lines = wanted
    found = _find_table(lines)
    if found is None:
        raise ProfilerKitError("no table found in the `nsys stats` output")
    fmt, header_at = found
    frame = _parse_csv(lines, header_at) if fmt == "csv" else _parse_text(lines, header_at)
    duplicated = frame.columns[frame.columns.duplicated()]
    if len(duplicated):
        raise ProfilerKitError(f"the `nsys stats` table has the column {duplicated[0]!r} twice")
    return StatsTable(report, frame, fmt)


def time_unit(columns: list[str]) -> str:
    """The unit of the time columns, from headers like `Total Time (us)`."""
    for column in columns:
        m = _TIME_COLUMN.match(column)
        if m and m["what"] == "Total Time" and m["unit"] in NS_PER_UNIT:
            return m["unit"]
    raise ProfilerKitError(f"no `Total Time (<unit>)` column among: {', '.join(columns)}")


def to_ns(values: pd.Series, unit: str) -> np.ndarray:
    """Times as integer nanoseconds; newer text tables write thousands separators. A time that is not a
    finite, non-negative number is an error: a summary must not add it up."""
    numbers = _numbers(values, "times")
    ns = numbers * NS_PER_UNIT[unit]
    if (ns >= MAX_NS).any():
        raise ProfilerKitError(f"a time in the `nsys stats` table is too large: {values[ns >= MAX_NS].iloc[0]!r}")
    return np.rint(ns).astype(np.int64)


def _numbers(values: pd.Series, what: str) -> np.ndarray:
    """Cells as floats; a cell that is text, non-finite or negative is an error that quotes it."""
    numbers = pd.to_numeric(values.astype(str).str.replace(",", "", regex=False), errors="coerce").to_numpy(
        dtype=float
    )
    bad = ~np.isfinite(numbers) | (numbers < 0)
    if bad.any():
        raise ProfilerKitError(
            f"{what} in the `nsys stats` table that are not finite, non-negative numbers: {int(bad.sum())}, "
            f"the first {values[bad].iloc[0]!r}"
        )
    return numbers


def load_stats(text: str, path: Path) -> KernelTrace:
    """A kernel summary (`cuda_gpu_kern_sum`/`gpukernsum`) as a trace of per-name totals, without NVTX."""
    if _SKIPPED.search(text) and _find_table(_lines(text)) is None:
        return KernelTrace(
            "nsys-stats",
            path,
            kernel_frame([], []),
            notes=["nsys stats found no CUDA kernel data in its report"],
        )
    table = read_stats_table(text)
    columns = [str(c) for c in table.frame.columns]
    if table.report in NVTX_KERNEL_REPORTS or {"NVTX Range", "Kernel Name"} <= set(columns):
        raise ProfilerKitError(
            f"{path}: an `nsys stats` NVTX kernel summary (nvtx_kern_sum), which attributes kernels per "
            "thread only; give the cuda_gpu_kern_sum output, or the .sqlite/.nsys-rep for per-phase times"
        )
    if not _is_kernel_summary(table.report, columns):
        what = f"the `{table.report}` report" if table.report else "another report"
        raise ProfilerKitError(
            f"{path}: `nsys stats` output of {what} (columns: {', '.join(columns)}); "
            "summarize reads the kernel summary, cuda_gpu_kern_sum (gpukernsum before nsys 2023.1)"
        )
    unit = time_unit(columns)
    frame = table.frame
    names = frame["Name"].astype(str)
    totals = pd.DataFrame(
        {
            "name": names,
            "instances": _instances(frame["Instances"]),
            "total_ns": checked_total(to_ns(frame[_total_column(columns)], unit), "kernel"),
        }
    )
    # 2022's report has one row per (name, grid, block); a summary wants one per name.
    per_name = totals.groupby("name", sort=False, as_index=False).agg(
        instances=("instances", "sum"), total_ns=("total_ns", "sum")
    )
    notes = []
    resolution_ns = NS_PER_UNIT[unit] / 10 ** _decimals(frame[_total_column(columns)])
    if resolution_ns > 1:
        notes.append(
            f"the input gives times in {unit}: each kernel's total is rounded to {resolution_ns:g} ns"
        )
    if table.fmt == "text" and names.str.endswith(TRUNCATION_MARK).any():
        notes.append(
            "nsys's text table cuts long kernel names; categories and kernel rows use the cut names "
            "(its --format csv keeps them whole)"
        )
    kernels = kernel_frame(per_name["name"], per_name["total_ns"], instances=per_name["instances"])
    return KernelTrace(f"nsys-stats-{table.fmt}", path, kernels, notes=notes)


def _instances(values: pd.Series) -> np.ndarray:
    counts = _numbers(values, "Instances counts")
    bad = (counts != np.floor(counts)) | (counts >= MAX_NS)
    if bad.any():
        raise ProfilerKitError(f"an Instances count in the `nsys stats` table is not a whole number within "
                               f"int64: {values[bad].iloc[0]!r}")
    return counts.astype(np.int64)


def _decimals(values: pd.Series) -> int:
    """The most digits after the decimal point among some numbers written as text."""
    fractions = values.astype(str).str.extract(r"\.(\d+)$")[0].dropna()
    return int(fractions.str.len().max()) if len(fractions) else 0


def _total_column(columns: list[str]) -> str:
    return next(c for c in columns if c.startswith("Total Time"))


def _is_kernel_summary(report: str | None, columns: list[str]) -> bool:
    if report is not None and report.split(":")[0] not in KERNEL_REPORTS:
        return False
    needed = {"Instances", "Name"}
    foreign = {"Operation", "Category", "Style", "Range", "Num Calls", "Count"}
    return (
        needed <= set(columns)
        and not foreign & set(columns)
        and any(c.startswith("Total Time") for c in columns)
    )


def _sections(text: str) -> list[tuple[str | None, list[str]]]:
    """Split output that holds several reports at their ` ** Title (report):` lines."""
    sections: list[tuple[str | None, list[str]]] = [(None, [])]
    for line in _lines(text):
        m = _SECTION.match(line)
        if m:
            sections.append((m["report"].split(":")[0], []))
        else:
            sections[-1][1].append(line)
    return [s for s in sections if s[1] and _find_table(s[1]) is not None] or sections[:1]


def _find_table(lines: list[str]) -> tuple[str, int] | None:
    """("csv" | "text", index of the header line), skipping nsys's preamble lines."""
    for i, line in enumerate(lines):
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if _DASH_RULE.match(nxt) and line.strip():
            return "text", i
        if _PLUS_RULE.match(line) and nxt.lstrip().startswith("|"):
            return "text", i + 1
        if "," in line and _CSV_HEADER.match(line.strip()):
            return "csv", i
    return None


def _parse_csv(lines: list[str], header_at: int) -> pd.DataFrame:
    body = "\n".join(lines[header_at:])
    reader = csv.reader(io.StringIO(body), strict=True)
    try:
        rows = [row for row in reader if row]
    except csv.Error as exc:
        line = header_at + reader.line_num
        if "unexpected end of data" in str(exc):
            raise ProfilerKitError(f"the `nsys stats` CSV ends inside a quoted cell at its line {line}: the file "
                                   "is cut short") from None
        raise ProfilerKitError(f"the `nsys stats` CSV is malformed at its line {line} ({exc})") from None
    header, data = rows[0], rows[1:]
    width = len(header)
    if data and len(data[-1]) < width:
        raise ProfilerKitError(f"the last row of the `nsys stats` CSV has {len(data[-1])} of its header's {width} "
                               "cells: the file is cut short")
    if any(len(row) != width for row in data):
        raise ProfilerKitError(
            "a CSV row of the `nsys stats` output has a different number of cells than its header"
        )
    return pd.DataFrame(data, columns=header, dtype=str)


def _parse_text(lines: list[str], header_at: int) -> pd.DataFrame:
    header = lines[header_at]
    if header.lstrip().startswith("|"):
        return _parse_pipes(lines, header_at)
    spans = [m.start() for m in re.finditer(r"-+", lines[header_at + 1])]
    bounds = list(zip(spans, spans[1:] + [None], strict=True))
    names = [header[a:b].strip() for a, b in bounds]
    rows = []
    for line in lines[header_at + 2 :]:
        if not line.strip():
            break
        rows.append([line[a:b].strip() for a, b in bounds])
    return pd.DataFrame(rows, columns=names, dtype=str)


def _parse_pipes(lines: list[str], header_at: int) -> pd.DataFrame:
    """The `--format table` variant: cells between `|`, rules of `+---+`."""

    def cells(line: str) -> list[str]:
        return [c.strip() for c in line.strip().strip("|").split("|")]

    names = cells(lines[header_at])
    rows = []
    for line in lines[header_at + 1 :]:
        if _PLUS_RULE.match(line):
            continue
        if not line.lstrip().startswith("|"):
            break
        rows.append(cells(line))
    if any(len(row) != len(names) for row in rows):
        raise ProfilerKitError("a row of the `nsys stats` table has a different number of cells than its header")
    return pd.DataFrame(rows, columns=names, dtype=str)
