"""Reading any kernel report a user has: told apart by content, not by file name.

SQLite files start with a fixed magic, gzip with two bytes, nsys reports with their own banner; JSON starts
with a brace; what is left must be text holding an `nsys stats` table. Every way a file can be wrong ends in
a one-line ProfilerKitError that says what the file looked like and what summarize reads.
"""

from __future__ import annotations

from pathlib import Path

from profiler_kit.errors import ProfilerKitError
from profiler_kit.files import (
    GZIP_MAGIC,
    NSYS_REPORT_MAGIC,
    SQLITE_MAGIC,
    InputLimits,
    read_bytes,
    read_head,
)
from profiler_kit.kernels.nsys_sqlite import load_sqlite
from profiler_kit.kernels.nsys_stats import load_stats, looks_like_stats
from profiler_kit.kernels.torch_trace import load_torch_trace
from profiler_kit.kernels.trace import KernelTrace

NSYS_REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
# What nsys says of a report made by a newer version than itself.
UNSUPPORTED_REPORT = "Version not supported"
# Enough of the start of a file to recognise every kind above.
SNIFF_BYTES = 64
ACCEPTED = (
    "an nsys .nsys-rep report or its .sqlite export, `nsys stats` cuda_gpu_kern_sum output (CSV or text), "
    "or a torch.profiler Chrome trace (.json, .json.gz)"
)


def sniff(path: Path) -> str:
    """The kind of a file: nsys-rep, sqlite, gzip, json, text or binary."""
    head = read_head(path, SNIFF_BYTES)
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
    if b"\x00" in head:
        return "binary"
    return "text"


def load(path: str | Path, limits: InputLimits | None = None) -> KernelTrace:
    """Load any supported kernel report, reading at most `limits` (default: those of `files.set_limits`). Every
    error names the file."""
    path = Path(path)
    try:
        return _load(path, limits)
    except ProfilerKitError as exc:
        if str(exc).startswith(str(path)):
            raise
        raise type(exc)(f"{path}: {exc}") from None


def load_many(paths: list[str | Path], jobs: int = 1) -> list[KernelTrace]:
    """`load` of each report, in the order given, `jobs` at a time in worker processes (here, with 1): reading
    and parsing is most of a summary's time, and one report's reading does not wait for another's."""
    from profiler_kit.engine import Engine

    return Engine(jobs).map(load, paths)


def _load(path: Path, limits: InputLimits | None) -> KernelTrace:
    kind = sniff(path)
    if kind == "sqlite":
        _refuse_stale_export(path)
        return load_sqlite(path)
    if kind == "nsys-rep":
        return _load_report(path)
    if kind in ("gzip", "json"):
        return load_torch_trace(path, limits)
    if kind == "binary":
        raise ProfilerKitError(f"{path}: not a kernel report (binary data); expected {ACCEPTED}")
    return _load_text(path, limits)


def _refuse_stale_export(path: Path) -> None:
    """An export older than the report beside it describes an earlier recording, not the report's."""
    from profiler_kit.nsys_tool import is_stale

    for suffix in NSYS_REPORT_SUFFIXES:
        report = path.with_suffix(suffix)
        if report.is_file() and is_stale(path, report):
            raise ProfilerKitError(
                f"{path}: older than {report.name} beside it, so it is the export of an earlier recording; "
                f"summarize {report} (exported again with nsys), or `touch` the .sqlite if it is that report's"
            )


def _load_report(path: Path) -> KernelTrace:
    """An .nsys-rep is read through its SQLite export, made (or refreshed) beside it by nsys. A report this
    nsys cannot open (made by a newer one) is an error that says how to export it where it was recorded."""
    from profiler_kit.nsys_tool import NsysError, export_sqlite, find_nsys

    try:
        sqlite = export_sqlite(path)
    except NsysError as exc:
        if UNSUPPORTED_REPORT not in str(exc):
            raise
        version = find_nsys().version_str
        raise ProfilerKitError(
            f"{path}: this nsys ({version}) cannot open it (\"{UNSUPPORTED_REPORT}\": a newer nsys recorded it); "
            f"run `nsys export --type sqlite --output {path.with_suffix('.sqlite').name} {path.name}` where it was "
            "recorded and give the .sqlite (or set $NSYS to an nsys as new as that one)") from None
    return load_sqlite(sqlite)


def _load_text(path: Path, limits: InputLimits | None) -> KernelTrace:
    try:
        text = read_bytes(path, limits, reader="an `nsys stats` table").decode("utf-8")
    except UnicodeDecodeError:
        raise ProfilerKitError(f"{path}: not a kernel report (binary data); expected {ACCEPTED}") from None
    if not looks_like_stats(text):
        raise ProfilerKitError(f"{path}: a text file without an `nsys stats` table; expected {ACCEPTED}")
    return load_stats(text, path)
