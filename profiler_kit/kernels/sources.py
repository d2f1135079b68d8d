"""Reading any kernel report a user has: told apart by content, not by file name.

SQLite files start with a fixed magic, gzip with two bytes, nsys reports with their own banner; JSON starts
with a brace; what is left must be text holding an `nsys stats` table. Every way a file can be wrong ends in
a one-line ProfilerKitError that says what the file looked like and what summarize reads.
"""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

from profiler_kit.errors import ProfilerKitError
from profiler_kit.kernels.nsys_sqlite import load_sqlite
from profiler_kit.kernels.nsys_stats import load_stats, looks_like_stats
from profiler_kit.kernels.torch_trace import load_torch_trace
from profiler_kit.kernels.trace import KernelTrace

SQLITE_MAGIC = b"SQLite format 3\x00"
GZIP_MAGIC = b"\x1f\x8b"
NSYS_REPORT_MAGIC = b"NVIDIA Tegra Profiler Report"
NSYS_REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
# Enough of the start of a file to recognise every kind above.
SNIFF_BYTES = 64
ACCEPTED = (
    "an nsys .nsys-rep report or its .sqlite export, `nsys stats` cuda_gpu_kern_sum output (CSV or text), "
    "or a torch.profiler Chrome trace (.json, .json.gz)"
)


def sniff(path: Path) -> str:
    """The kind of a file: nsys-rep, sqlite, gzip, json or text."""
    if not path.exists():
        raise ProfilerKitError(f"{path}: no such file")
    if path.is_dir():
        raise ProfilerKitError(f"{path}: a directory, not a file")
    try:
        with path.open("rb") as fh:
            head = fh.read(SNIFF_BYTES)
    except OSError as exc:
        raise ProfilerKitError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if not head:
        raise ProfilerKitError(f"{path}: empty file")
    if head.startswith(SQLITE_MAGIC):
        return "sqlite"
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    if head.startswith(NSYS_REPORT_MAGIC) or path.suffix in NSYS_REPORT_SUFFIXES:
        return "nsys-rep"
    if head.lstrip()[:1] in (b"{", b"["):
        return "json"
    return "text"


def load(path: str | Path) -> KernelTrace:
    """Load any supported kernel report."""
    path = Path(path)
    kind = sniff(path)
    if kind == "sqlite":
        return load_sqlite(path)
    if kind == "nsys-rep":
        return _load_report(path)
    if kind in ("gzip", "json"):
        return load_torch_trace(_read_json(path, kind), path)
    return _load_text(path)


def _load_report(path: Path) -> KernelTrace:
    """An .nsys-rep is read through its SQLite export, made (or refreshed) beside it by nsys."""
    from profiler_kit.nsys_tool import export_sqlite

    return load_sqlite(export_sqlite(path))


def _read_json(path: Path, kind: str) -> object:
    try:
        if kind == "gzip":
            with gzip.open(path, "rt", encoding="utf-8") as fh:
                return json.load(fh)
        with path.open(encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, EOFError, zlib.error) as exc:
        raise ProfilerKitError(f"{path}: damaged or truncated gzip file ({exc})") from None
    except UnicodeDecodeError:
        raise ProfilerKitError(f"{path}: not a kernel report (binary data); expected {ACCEPTED}") from None
    except json.JSONDecodeError as exc:
        raise ProfilerKitError(
            f"{path}: not valid JSON (line {exc.lineno}: {exc.msg}); expected {ACCEPTED}"
        ) from None


def _load_text(path: Path) -> KernelTrace:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ProfilerKitError(f"{path}: not a kernel report (binary data); expected {ACCEPTED}") from None
    if not looks_like_stats(text):
        raise ProfilerKitError(f"{path}: a text file without an `nsys stats` table; expected {ACCEPTED}")
    return load_stats(text, path)
