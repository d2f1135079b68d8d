"""Reading the files users give us within fixed bounds, and writing the files we make without losing old ones.

Inputs may be anything: a FIFO that never ends, /dev/zero, a symbolic link loop, a gzip that expands a
thousandfold, JSON nested a million deep. Every reader goes through `check_input` (regular files only) and
reads at most `InputLimits.max_bytes` into memory, so a hostile input ends in a one-line ProfilerKitError
instead of a hang, a MemoryError or a traceback. Outputs (reports, traces, plots) are written under a
temporary name and renamed into place once complete, so a failed run never leaves a previous file deleted or
half overwritten.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import json
import os
import stat
import time
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from profiler_kit.errors import ProfilerKitError, UsageProblem

MIB = 2**20
# Bytes one input may put in memory (after decompression): well above a torch.profiler trace of a few steps or
# an `nsys stats` table, well below what fills a 4 GiB address space once parsed.
DEFAULT_MAX_INPUT_MB = 256
# How the limit is raised, for messages.
RAISE_HINT = "raise the limit with `profiler-kit --max-input-mb N ...`"
READ_CHUNK = 4 * MIB
# The first bytes of the kinds of file the readers tell apart.
GZIP_MAGIC = b"\x1f\x8b"
SQLITE_MAGIC = b"SQLite format 3\x00"
NSYS_REPORT_MAGIC = b"NVIDIA Tegra Profiler Report"

_SPECIAL = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


@dataclass(frozen=True)
class InputLimits:
    """How much of one input file may be read into memory."""

    max_bytes: int = DEFAULT_MAX_INPUT_MB * MIB

    @property
    def max_mb(self) -> float:
        return self.max_bytes / MIB


_limits = InputLimits()


def current_limits() -> InputLimits:
    """The limits every reader uses unless given its own."""
    return _limits


def set_limits(limits: InputLimits) -> None:
    """The limits every reader uses unless given its own (the CLI's `--max-input-mb`)."""
    global _limits
    _limits = limits


def check_input(path: str | os.PathLike) -> int:
    """The size of `path` if it is a regular file that can be read; else a one-line error saying what it is.
    Only `stat` is called, which never blocks, so a FIFO is refused before anything opens it."""
    path = Path(path)
    try:
        info = path.stat()
    except OSError as exc:
        raise ProfilerKitError(f"{path}: {_os_reason(exc)}") from None
    if stat.S_ISDIR(info.st_mode):
        raise ProfilerKitError(f"{path}: a directory, not a file")
    for test, what in _SPECIAL:
        if test(info.st_mode):
            raise ProfilerKitError(f"{path}: {what}, not a regular file; give the file itself")
    if not stat.S_ISREG(info.st_mode):
        raise ProfilerKitError(f"{path}: not a regular file")
    # Opened for real: permission bits alone do not tell (root reads a file of mode 000; ACLs, read-only
    # network mounts). Non-blocking, though a regular file never blocks.
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
    except OSError as exc:
        raise ProfilerKitError(f"{path}: cannot be read ({_os_reason(exc).lower()})") from None
    return info.st_size


def _os_reason(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "a loop of symbolic links (it never reaches a file)"
    if exc.errno == errno.ENOENT:
        return "no such file" if not os.path.islink(exc.filename or "") else "a symbolic link to nothing"
    return exc.strerror or str(exc)


def _over_limit(path: Path, what: str, limits: InputLimits, reader: str) -> ProfilerKitError:
    return ProfilerKitError(f"{path}: {what} more than the {limits.max_mb:g} MiB an input may hold: {reader} is "
                            f"read whole, not streamed; {RAISE_HINT}")


def read_bytes(path: str | os.PathLike, limits: InputLimits | None = None, reader: str = "this input") -> bytes:
    """The whole file, if it is a regular file within the size limit; `reader` says what is read whole, for the
    error past the limit."""
    path, limits = Path(path), limits or _limits
    size = check_input(path)
    if size > limits.max_bytes:
        raise _over_limit(path, f"{size / MIB:,.0f} MiB,", limits, reader)
    try:
        with path.open("rb") as fh:
            data = fh.read(limits.max_bytes + 1)
    except OSError as exc:
        raise ProfilerKitError(f"{path}: cannot read ({_os_reason(exc)})") from None
    if len(data) > limits.max_bytes:
        raise _over_limit(path, "grew while being read to", limits, reader)
    return data


def read_head(path: str | os.PathLike, size: int) -> bytes:
    """The first `size` bytes of a checked regular file."""
    path = Path(path)
    check_input(path)
    try:
        with path.open("rb") as fh:
            return fh.read(size)
    except OSError as exc:
        raise ProfilerKitError(f"{path}: cannot read ({_os_reason(exc)})") from None


def is_gzip(path: str | os.PathLike) -> bool:
    """Whether a checked regular file starts as gzip data does."""
    return read_head(path, len(GZIP_MAGIC)) == GZIP_MAGIC


def read_gzip(path: str | os.PathLike, limits: InputLimits | None = None, reader: str = "this input") -> bytes:
    """A gzip file's contents, decompressed in chunks and refused once they pass the limit."""
    path, limits = Path(path), limits or _limits
    check_input(path)
    chunks, total = [], 0
    try:
        with gzip.open(path, "rb") as fh:
            while chunk := fh.read(READ_CHUNK):
                total += len(chunk)
                if total > limits.max_bytes:
                    raise _over_limit(path, "a gzip file that expands to", limits, reader)
                chunks.append(chunk)
    except (OSError, EOFError, zlib.error) as exc:
        raise ProfilerKitError(f"{path}: damaged or truncated gzip file ({exc})") from None
    return b"".join(chunks)


def parse_json(data: bytes, path: Path) -> object:
    """JSON from bytes; invalid, undecodable or too deeply nested JSON is a one-line error."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ProfilerKitError(f"{path}: JSON nested deeper than the reader's limit (about 1,000 levels)") from None
    except UnicodeDecodeError:
        raise ProfilerKitError(f"{path}: not JSON text (binary data)") from None
    except json.JSONDecodeError as exc:
        raise ProfilerKitError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None


@contextlib.contextmanager
def replaced_when_complete(path: str | os.PathLike, overwrite: bool = True) -> Iterator[Path]:
    """A temporary path beside `path` to write to; put at `path` (see `publish`) when the block ends without an
    error, removed when it fails. An existing file at `path` stays untouched until the new one is complete, and
    with `overwrite` False it is never replaced: that is an error, before the block runs and after.

    Use it for every report, trace and plot a command writes: `with replaced_when_complete(out) as tmp: ...`.
    The temporary name keeps the suffixes, so tools that pick a format by extension still work.
    """
    path = Path(path)
    if not overwrite and (path.exists() or path.is_symlink()):
        raise _exists(path)
    check_output(path)
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}{''.join(path.suffixes)}")
    kept = "; the file there before is unchanged" if path.exists() else ""
    try:
        yield tmp
        if not tmp.is_file():
            raise ProfilerKitError(f"{path}: nothing was written{kept}")
        publish(tmp, path, overwrite)
    except OSError as exc:
        raise ProfilerKitError(f"{path}: could not be written ({exc.strerror or exc}){kept}") from None
    finally:
        tmp.unlink(missing_ok=True)


def _exists(path: Path) -> ProfilerKitError:
    return ProfilerKitError(f"{path} already exists; pass another --output (it is never replaced)")


def publish(tmp: str | os.PathLike, path: str | os.PathLike, overwrite: bool = True) -> None:
    """Move the complete file `tmp` to `path`, replacing what is there; with `overwrite` False only where
    nothing is, atomically (a hard link, which fails on an existing name), so a file that appeared meanwhile is
    kept and `tmp` stays for the caller to remove."""
    tmp, path = Path(tmp), Path(path)
    if overwrite:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)
    except OSError as exc:
        if isinstance(exc, FileExistsError) or path.exists() or path.is_symlink():
            raise _exists(path) from None
        os.replace(tmp, path)  # a file system without hard links: checked just before, then renamed
    else:
        tmp.unlink()


def check_output(path: str | os.PathLike) -> Path:
    """Fail now, before any work, when `path` could not be written: its folder cannot be made or written to, or
    it is a directory or a read-only file. Tried for real (a new file is created and removed again), since
    permission bits do not tell for root, read-only mounts or /proc."""
    path = Path(path)
    parent = path.parent
    if parent.exists() and not parent.is_dir():
        raise ProfilerKitError(f"{path}: {parent} is not a folder")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ProfilerKitError(f"{parent}: cannot create the folder ({exc.strerror or exc})") from None
    if path.is_dir():
        raise ProfilerKitError(f"{path}: a directory, not a file")
    existed = path.exists()
    if existed and not stat.S_ISREG(path.stat().st_mode):
        raise ProfilerKitError(f"{path}: exists and is not a regular file")
    try:
        with path.open("ab"):
            pass
    except OSError as exc:
        raise ProfilerKitError(f"{path}: cannot be written ({exc.strerror or exc})") from None
    if not existed:
        path.unlink(missing_ok=True)
    return path


class Reservation:
    """A recording output held by this run: a lock file `.<name>.lock` beside it, made create-exclusive and
    holding this process's id, removed by `release` (or leaving the `with` block)."""

    def __init__(self, path: Path, lock: Path) -> None:
        self.path, self.lock = path, lock

    def release(self) -> None:
        self.lock.unlink(missing_ok=True)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# A lock younger than this whose process id cannot be read yet is being made by another run.
LOCK_WRITE_S = 10


def _holder(lock: Path) -> int | None:
    """The live process that holds `lock` (0 when its id is not written yet), or None when the lock is stale:
    its process is gone, or it never got an id."""
    try:
        text = lock.read_text().strip()
        if not text.isdigit():
            return 0 if time.time() - lock.stat().st_mtime < LOCK_WRITE_S else None
    except OSError:
        return None
    pid = int(text)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid  # alive, another user's
    return pid


def reserve_output(path: str | os.PathLike, force: bool, others: tuple[Path, ...] = ()) -> Reservation:
    """Hold the recording output `path` (and `others`, files of the same recording) for this run from its
    start: a concurrent run with the same output fails here at once, and an existing output is refused unless
    `force` (UsageProblem; with `force` it is replaced once the new recording is complete). A lock left by a
    run that died is taken over."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        check_output(path)  # says why in one line
    lock = path.with_name(f".{path.name}.lock")
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            pid = _holder(lock)
            if pid is not None:
                who = f" (process {pid})" if pid else ""
                raise ProfilerKitError(f"{path}: another run{who} is recording it; wait for it or pass another "
                                       "--output") from None
            lock.unlink(missing_ok=True)
            continue
        except OSError as exc:
            raise ProfilerKitError(f"{path}: cannot be written ({exc.strerror or exc})") from None
        with os.fdopen(fd, "w") as fh:
            fh.write(str(os.getpid()))
        break
    else:
        raise ProfilerKitError(f"{path}: another run keeps taking it; pass another --output")
    reservation = Reservation(path, lock)
    try:
        existing = [p for p in (path, *others) if p.exists() or p.is_symlink()]
        if existing and not force:
            exist, it = ("exists", "it") if len(existing) == 1 else ("exist", "them")
            raise UsageProblem(f"{', '.join(map(str, existing))} already {exist}; pass another --output, or "
                               f"--force to replace {it} once the new recording is complete")
        check_output(path)  # only now: it may create and remove `path`, which no other run may then be making
    except ProfilerKitError:
        reservation.release()
        raise
    return reservation


def _same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file: equal once symlinks are followed, or hard links of one inode."""
    if a.resolve() == b.resolve():
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def check_output_paths(outputs: Iterable[str | os.PathLike | None], inputs: Iterable[str | os.PathLike | None],
                       force: bool) -> None:
    """Refuse, before any work (UsageProblem, exit 2), outputs of one run that name (symlinks followed) one of
    its inputs (their sidecars included) or another of its outputs, and, without `force`, an output that exists."""
    outs = [Path(p) for p in outputs if p is not None]
    ins = [Path(p) for p in inputs if p is not None]
    for i, out in enumerate(outs):
        try:
            os.stat(out)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UsageProblem(f"{out}: {_os_reason(exc)}; give another path") from None
        for source in ins:
            if _same_file(out, source):
                raise UsageProblem(f"{out} is an input of this command ({source}); write the output elsewhere")
        for other in outs[:i]:
            if _same_file(out, other):
                raise UsageProblem(f"{out} and {other} are the same file; give each output its own path")
        if not force and (out.exists() or out.is_symlink()):
            raise UsageProblem(f"{out} already exists: pass -f/--force to replace it, or another path")
