"""Nsight Systems from Python: finding `nsys`, reading its version, running `export` and `stats`: what the
recorder (`recording.runner`) and the report readers (`kernels.sources`) both use.

nsys versions disagree on report names (2023.1 renamed `gpukernsum` to `cuda_gpu_kern_sum` and the other
stats reports with it), newer ones refuse an SQLite export older than its report, and many failures exit 0
with an `ERROR:` line. This module hides those differences and turns every failure into one line that names
the command, quotes the tail of nsys's output and, for causes we know, says what to do.
"""

from __future__ import annotations

import functools
import glob
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from profiler_kit.errors import ProfilerKitError

# Searched after --nsys, $NSYS, PATH and $CUDA_HOME/bin; within a pattern the newest version comes first.
SEARCH_GLOBS: tuple[str, ...] = (
    "/usr/local/cuda*/bin/nsys",
    "/opt/nvidia/nsight-systems/*/bin/nsys",
    # Nsight Compute ships a copy of the nsys CLI.
    "/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys",
    # Debian's 2022.4, which `make test` installs into the virtual environment (tools/install_nsys_debian.sh).
    glob.escape(sys.prefix) + "/nsys-debian/usr/lib/nsight-systems/bin/nsys",
)

# Stats reports: 2023.1-and-later name → the name before. Debian's 2022.4.2 lists only the right-hand names
# (`nsys stats --help-reports`); 2025.3 lists only the left-hand ones.
REPORT_RENAMES: dict[str, str] = {
    "cuda_api_sum": "cudaapisum",
    "cuda_api_trace": "cudaapitrace",
    "cuda_api_gpu_sum": "apigpusum",
    "cuda_gpu_kern_sum": "gpukernsum",
    "cuda_gpu_mem_size_sum": "gpumemsizesum",
    "cuda_gpu_mem_time_sum": "gpumemtimesum",
    "cuda_gpu_sum": "gpusum",
    "cuda_gpu_trace": "gputrace",
    "cuda_kern_exec_sum": "kernexecsum",
    "cuda_kern_exec_trace": "kernexectrace",
    "nvtx_kern_sum": "nvtxkernsum",
    "nvtx_pushpop_sum": "nvtxppsum",
    "nvtx_pushpop_trace": "nvtxpptrace",
    "nvtx_startend_sum": "nvtxsesum",
    "nvtx_sum": "nvtxsum",
    "osrt_sum": "osrtsum",
}
OLD_TO_NEW = {old: new for new, old in REPORT_RENAMES.items()}
RENAMED_IN = (2023, 1)

# `nsys --version` answers in about a second; a hung binary must not hang the tool.
VERSION_TIMEOUT_S = 60
# How much of nsys's output a failure message quotes.
TAIL_LINES = 6
TAIL_CHARS = 600
REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
# How much newer a report must be than the .sqlite beside it for the export to be stale: a checkout or a copy
# writes the pair in either order within moments, a new recording comes at least seconds later.
STALE_AFTER_NS = 2_000_000_000

UNKNOWN_REPORT = r"Report '[^']*' could not be found"
# Known causes of failures, matched against nsys's output (and the profiled program's); first match wins.
HINTS: tuple[tuple[str, str], ...] = (
    (r"libdw\.so\.1",
     "nsys's importer (QdstrmImporter) needs libdw.so.1: install libdw1 (apt-get install libdw1)"),
    (r"(?i)QdstrmImporter|importer (error|failed)|could not (make|create|generate)[^\n]*report",
     "nsys recorded a .qdstrm but could not make a report of it: run QdstrmImporter (in nsys's "
     "host-linux-x64 folder) on that file to see why; `ldd QdstrmImporter` lists missing libraries"),
    (UNKNOWN_REPORT,
     "this nsys does not know that report; report names changed in 2023.1 (gpukernsum → cuda_gpu_kern_sum)"),
    (r"force-export|older than", "the SQLite export beside the report is stale: delete it and run again"),
    (r"(?i)newer version|unsupported (file|report) version|version .*not supported",
     "the report was made by a newer nsys than this one: pass --nsys with that version"),
    (r"Cannot read from stream|[Cc]orrupt|not a valid|[Ww]rong file format",
     "the file is damaged or not an nsys report, or was recorded by a newer nsys than this one"),
    (r"ERR_NVGPUCTRPERM|CUPTI_ERROR_INSUFFICIENT_PRIVILEGES",
     "GPU performance counters need privileges (NVreg_RestrictProfilingToAdminUsers=0, or root)"),
    (r"(?i)out of memory|OutOfMemoryError",
     "the workload ran out of GPU memory: lower --batch-size or --ctx, or use --mixed-precision"),
)
# Progress bars ("[1/1] [===  50%  ] r.nsys-rep", "Exporting 112 events: [==12%  ]") say nothing in an error.
_PROGRESS = re.compile(r"\[[= ]*\d+%[= ]*\]")
_ERROR_LINE = re.compile(r"^\s*(ERROR|Exportation error|FATAL)\b", re.MULTILINE)


class NsysError(ProfilerKitError):
    """nsys is missing or failed; the message carries the command, its output's tail and a hint."""


@dataclass(frozen=True)
class NsysInstall:
    """One nsys executable and its version, e.g. (2025, 3, 1, 90) for 2025.3.1.90."""

    path: Path
    version: tuple[int, ...]

    @property
    def version_str(self) -> str:
        return ".".join(str(v) for v in self.version)

    @property
    def new_report_names(self) -> bool:
        """Whether this version spells stats reports the 2023.1 way (`cuda_gpu_kern_sum`)."""
        return self.version[:2] >= RENAMED_IN

    def report_name(self, report: str) -> str:
        """This version's name for a stats report given in either spelling."""
        return spelled(report, self.new_report_names)

    @property
    def report_names(self) -> dict[str, str]:
        """Every known report, by its 2023.1 name, → the name this version uses."""
        return {new: self.report_name(new) for new in REPORT_RENAMES}


def spelled(report: str, new: bool) -> str:
    """`report` in the 2023.1 spelling (`new`) or the older one; `:args` are kept, unknown names unchanged."""
    base, sep, args = report.partition(":")
    base = OLD_TO_NEW.get(base, base) if new else REPORT_RENAMES.get(base, base)
    return base + sep + args


def parse_version(text: str) -> tuple[int, ...]:
    """(2025, 3, 1, 90) from "NVIDIA Nsight Systems version 2025.3.1.90-253135822126v0"."""
    match = re.search(r"version\s+(\d+(?:\.\d+)+)", text)
    if match is None:
        raise ValueError(f"no version in {text.strip()[:200]!r}")
    return tuple(int(part) for part in match.group(1).split("."))


def _natural_key(path: str) -> list:
    return [int(tok) if tok.isdigit() else tok for tok in re.split(r"(\d+)", path)]


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _explicit_path(path: Path, origin: str) -> Path:
    """--nsys and $NSYS name the executable or its folder; a wrong one is an error, not something to skip."""
    candidate = path / "nsys" if path.is_dir() else path
    if not _is_executable(candidate):
        raise NsysError(f"{origin} {path}: no nsys executable there")
    return candidate


def search_candidates() -> list[tuple[str, Path]]:
    """(where, path) of every nsys on PATH, in $CUDA_HOME/bin and under SEARCH_GLOBS, in search order."""
    found: list[tuple[str, Path]] = []
    on_path = shutil.which("nsys")
    if on_path:
        found.append(("PATH", Path(on_path)))
    cuda_home = os.environ.get("CUDA_HOME")
    if cuda_home and _is_executable(Path(cuda_home, "bin", "nsys")):
        found.append(("$CUDA_HOME/bin", Path(cuda_home, "bin", "nsys")))
    for pattern in SEARCH_GLOBS:
        for hit in sorted(glob.glob(pattern), key=_natural_key, reverse=True):
            if _is_executable(Path(hit)):
                found.append((pattern, Path(hit)))
    return found


def find_nsys(explicit: str | os.PathLike | None = None) -> NsysInstall:
    """The nsys to use: `explicit` (--nsys), else $NSYS, PATH, $CUDA_HOME/bin, then the install folders."""
    if explicit:
        return _install(_explicit_path(Path(explicit), "--nsys"))
    if os.environ.get("NSYS"):
        return _install(_explicit_path(Path(os.environ["NSYS"]), "$NSYS"))
    candidates = search_candidates()
    if candidates:
        return _install(candidates[0][1])
    cuda_home = "$CUDA_HOME/bin" + ("" if os.environ.get("CUDA_HOME") else " ($CUDA_HOME unset)")
    tried = ", ".join(["--nsys", "$NSYS", "PATH", cuda_home, *SEARCH_GLOBS])
    raise NsysError(
        f"nsys (Nsight Systems) not found; tried {tried}. Install Nsight Systems or pass --nsys PATH, "
        "or record with torch.profiler instead: --backend torch (`profiler-kit profile -- COMMAND` picks it "
        "where there is no nsys)"
    )


def _install(path: Path) -> NsysInstall:
    return _read_version(path.absolute(), path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _read_version(path: Path, mtime_ns: int) -> NsysInstall:
    """Cached per executable and modification time: every export and stats call needs the version."""
    cmd = [str(path), "--version"]
    proc = run(cmd, timeout=VERSION_TIMEOUT_S)
    try:
        version = parse_version(proc.stdout + proc.stderr)
    except ValueError:
        raise NsysError(failure_message(cmd, proc, "printed no version")) from None
    return NsysInstall(path, version)


def run(cmd: Sequence[str], timeout: float | None = None) -> subprocess.CompletedProcess:
    """Run a command with its output captured as text, in a process group of its own: one that does not end
    within `timeout` seconds is killed with every process it started. A command that cannot start, or is
    killed so, is an NsysError."""
    try:
        proc = subprocess.Popen(list(cmd), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True)
    except OSError as exc:
        raise NsysError(f"could not run {cmd[0]}: {exc.strerror or exc}") from None
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        proc.communicate()
        raise NsysError(f"`{shlex.join(cmd)}` did not finish within {timeout:.0f} s; it was stopped") from None
    except BaseException:  # Ctrl-C: nothing of it is left running
        kill_group(proc.pid)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Send `sig` to the process group `pgid`; nothing when it is gone."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def output_tail(text: str, lines: int = TAIL_LINES) -> str:
    """The last meaningful lines of some output (progress bars dropped), joined into one line."""
    kept = [ln.strip() for ln in re.split(r"[\r\n]+", text) if ln.strip() and not _PROGRESS.search(ln)]
    tail = " | ".join(kept[-lines:])
    return tail if len(tail) <= TAIL_CHARS else "…" + tail[-TAIL_CHARS:]


def hint_for(text: str) -> str | None:
    return next((hint for pattern, hint in HINTS if re.search(pattern, text)), None)


def failure_message(cmd: Sequence[str], proc: subprocess.CompletedProcess, what: str = "failed") -> str:
    """One line: the command, its exit status, the tail of its stderr (else stdout) and a hint."""
    output = proc.stderr if proc.stderr.strip() else proc.stdout
    message = f"`{shlex.join(str(c) for c in cmd)}` {what} (exit {proc.returncode})"
    tail = output_tail(output)
    if tail:
        message += f": {tail}"
    hint = hint_for(proc.stderr + proc.stdout)
    if hint:
        message += f" — hint: {hint}"
    return message


def reported_error(proc: subprocess.CompletedProcess) -> bool:
    """nsys stats/export exit 0 after some errors (unknown report, unreadable input): read their words."""
    return proc.returncode != 0 or bool(_ERROR_LINE.search(proc.stderr))


def _require_file(path: Path) -> None:
    if not path.is_file():
        raise ProfilerKitError(f"{path}: no such file")


def is_stale(sqlite: Path, report: Path) -> bool:
    """Whether an export was made before the report beside it was recorded (so it is an earlier recording's)."""
    return sqlite.stat().st_mtime_ns + STALE_AFTER_NS < report.stat().st_mtime_ns


def export_sqlite(report: Path, nsys: NsysInstall | None = None) -> Path:
    """`<stem>.sqlite` beside `report`, exported now when it is missing, empty or older than the report."""
    report = Path(report)
    _require_file(report)
    sqlite = report.with_suffix(".sqlite")
    exported = sqlite.is_file() and sqlite.stat().st_size > 0
    if exported and sqlite.stat().st_mtime_ns >= report.stat().st_mtime_ns:
        return sqlite
    if nsys is None:
        try:
            nsys = find_nsys()
        except NsysError:
            if exported and not is_stale(sqlite, report):
                return sqlite  # written moments before the report, as copying the pair can do
            raise NsysError(_no_nsys_to_export(report, sqlite)) from None
    # Export under another name first, so that an interrupted export never passes for a fresh one.
    partial = report.with_name(f".{report.stem}.partial.sqlite")
    cmd = [str(nsys.path), "export", "--type", "sqlite", "--force-overwrite", "true", "--quiet", "true",
           "--output", str(partial), str(report)]
    try:
        proc = run(cmd)
        if reported_error(proc) or not partial.is_file():
            raise NsysError(failure_message(cmd, proc, "could not export SQLite"))
        os.replace(partial, sqlite)
    finally:
        partial.unlink(missing_ok=True)
    return sqlite


def _no_nsys_to_export(report: Path, sqlite: Path) -> str:
    beside = (f"; {sqlite.name} beside it is older than the report, the export of an earlier recording "
              "(`touch` it if it is this report's)" if sqlite.is_file() else "")
    return (f"{report}: an .nsys-rep is read through its SQLite export, which needs nsys, and nsys (Nsight "
            f"Systems) not found on PATH, $NSYS or the install folders{beside}; set $NSYS, or run `nsys export "
            f"--type sqlite {report.name}` where nsys is and give the .sqlite")


def run_stats(source: Path, report: str, nsys: NsysInstall | None = None, fmt: str = "csv") -> str:
    """stdout of `nsys stats --report <report> --format <fmt>` on a report or an SQLite export.

    `report` may be spelled either way; this nsys's spelling is tried first and the other one when nsys does
    not know it. A report source is re-exported (`--force-export=true`), so a stale SQLite beside it is never
    refused; nsys rejects that flag for `.sqlite` sources, which are read as they are.
    """
    source = Path(source)
    _require_file(source)
    nsys = nsys or find_nsys()
    force = ["--force-export=true"] if source.suffix in REPORT_SUFFIXES else []

    def attempt(name: str) -> tuple[list[str], subprocess.CompletedProcess]:
        cmd = [str(nsys.path), "stats", "--report", name, "--format", fmt, *force, str(source)]
        return cmd, run(cmd)

    name = nsys.report_name(report)
    cmd, proc = attempt(name)
    other = spelled(name, not nsys.new_report_names)
    if reported_error(proc) and re.search(UNKNOWN_REPORT, proc.stderr) and other != name:
        cmd, proc = attempt(other)
    if reported_error(proc):
        raise NsysError(failure_message(cmd, proc))
    return proc.stdout
