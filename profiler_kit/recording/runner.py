"""Profiling any command: `profiler-kit nsys [OPTIONS] -- COMMAND [ARGS]...`.

nsys backend: `nsys profile --trace=cuda,nvtx COMMAND`, with a `cudaProfilerApi` capture range on a machine
with CUDA (the program's steps marked by `profiler_kit.capture`, else everything from its first CUDA call),
then the SQLite export. torch backend: the command runs with `profiler_kit/_inject` first on PYTHONPATH, whose
`sitecustomize` starts torch.profiler in every Python process of it (for torchrun, in each worker, one trace per
rank), so the program needs no change. The program's output goes to stderr, so that stdout carries only the
summary; its exit status comes back unchanged.

Reports are written under a temporary name and renamed when complete; an existing report is never replaced.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from profiler_kit.environment import note
from profiler_kit.errors import ProfilerKitError
from profiler_kit.files import check_output, publish
from profiler_kit.recording.nsys import NsysError, export_sqlite, find_nsys
from profiler_kit.recording.child import RANKS_ONLY, RECORD, TRACE, TRACE_SUFFIX, trace_path
from profiler_kit.render import console_err

BACKENDS = ("nsys", "torch")
INJECT_DIR = Path(__file__).resolve().parent / "_inject"
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
# Kernels that a CUDA graph replays are recorded one by one, as the program launched them when it captured.
NSYS_PROGRAM_ARGS = ("profile", "--trace=cuda,nvtx", "--sample=none", "--cpuctxsw=none", "--cuda-graph-trace=node")
CAPTURE_ARGS = ("--capture-range=cudaProfilerApi", "--capture-range-end=stop")
LAUNCHERS = ("torchrun",)
REPORT_SUFFIX = ".nsys-rep"


@dataclass(frozen=True)
class ProgramRun:
    """What profiling a command gave: its exit status, the files written, and the ones to summarize (the
    SQLite export, or one Chrome trace per process: per rank under torchrun)."""

    command: tuple[str, ...]
    backend: str
    exit_code: int
    capture: str
    files: tuple[Path, ...]
    sources: tuple[Path, ...]


def program_name(command: list[str]) -> str:
    """The name a default output takes: the script's stem for `python x.py` / `torchrun ... x.py`, else
    the executable's name."""
    script = next((arg for arg in command[1:] if arg.endswith(".py")), None)
    if script and Path(command[0]).name.startswith(("python", *LAUNCHERS)):
        return Path(script).stem
    return Path(command[0]).stem


def default_output(command: list[str], folder: Path = Path("profiles")) -> Path:
    return folder / f"{program_name(command)}_{time.strftime('%Y%m%d_%H%M%S')}"


def resolve_command(command: list[str]) -> list[str]:
    """The command as it will run: a `.py` script alone runs under this Python; a program that cannot be
    found is an error."""
    if not command:
        raise ProfilerKitError("no command given after `--`")
    first = command[0]
    if first.endswith(".py") and not os.access(first, os.X_OK):
        if not Path(first).is_file():
            raise ProfilerKitError(f"{first}: no such file")
        return [sys.executable, *command]
    if shutil.which(first) is None:
        raise ProfilerKitError(f"{first}: no such program (not a file, and not on PATH)")
    script = next((arg for arg in command[1:] if arg.endswith(".py")), None)
    if script is not None and Path(first).name.startswith(("python", *LAUNCHERS)) and not Path(script).is_file():
        raise ProfilerKitError(f"{script}: no such file")
    return list(command)


def _is_launcher(command: list[str]) -> bool:
    return Path(command[0]).name in LAUNCHERS or "torch.distributed.run" in command[:3]


def _env(extra: dict[str, str]) -> dict[str, str]:
    """This environment with the injected sitecustomize and this package first on PYTHONPATH."""
    path = os.environ.get("PYTHONPATH")
    parts = [str(INJECT_DIR), str(PACKAGE_ROOT)] + ([path] if path else [])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(parts), **extra}


def _run(cmd: list[str], env: dict[str, str]) -> int:
    """Run with the program's stdout and stderr on our stderr; its exit status."""
    try:
        sys.stderr.flush()
        target = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # a stderr without a file (a test runner's capture)
        target = None
    try:
        if target is not None:
            return subprocess.run(cmd, env=env, stdout=target, stderr=target).returncode
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, errors="replace")
    except OSError as exc:
        raise ProfilerKitError(f"could not run {cmd[0]}: {exc.strerror or exc}") from None
    sys.stderr.write(proc.stdout + proc.stderr)
    return proc.returncode


def _refuse_existing(paths: list[Path]) -> None:
    existing = [str(p) for p in paths if p.exists()]
    if existing:
        raise ProfilerKitError(f"{', '.join(existing)} already exists; pass another --output (reports are never "
                               "replaced)")


def run_program(command: list[str], backend: str, output: Path | None = None,
                nsys_path: str | os.PathLike | None = None, nsys_args: tuple[str, ...] = (),
                capture: bool = True) -> ProgramRun:
    """Run `command` under `backend` (nsys or torch), writing `<output>.nsys-rep` and `.sqlite`, or
    `<output>.json.gz` (`<output>.rank<R>.json.gz` per torchrun worker). `capture` False records the whole
    run under nsys even when the program marks steps."""
    if backend not in BACKENDS:
        raise ProfilerKitError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
    cmd = resolve_command(command)
    output = Path(output) if output is not None else default_output(command)
    if backend == "torch":
        return _run_torch(cmd, output)
    nsys = find_nsys(nsys_path)
    note("nsys", nsys.version_str)
    return _run_nsys(cmd, output, nsys, nsys_args, capture)


def _run_torch(cmd: list[str], output: Path) -> ProgramRun:
    _refuse_existing([trace_path(output, None), *output.parent.glob(f"{output.name}.rank*{TRACE_SUFFIX}")])
    check_output(trace_path(output, None))
    extra = {RECORD: "torch", TRACE: str(output.absolute())}
    if _is_launcher(cmd):
        extra[RANKS_ONLY] = "1"
    console_err.print(f"torch.profiler: {shlex.join(cmd)}", soft_wrap=True, markup=False, highlight=False)
    code = _run(cmd, _env(extra))
    single = trace_path(output, None)
    ranked = sorted(output.parent.glob(f"{output.name}.rank*{TRACE_SUFFIX}"), key=_rank_of)
    traces = tuple([single] if single.is_file() else ranked)
    return ProgramRun(tuple(cmd), "torch", code, "torch.profiler", traces, traces)


def _rank_of(path: Path) -> int:
    rank = path.name.removesuffix(TRACE_SUFFIX).rsplit(".rank", 1)[-1]
    return int(rank) if rank.isdigit() else -1


def merge_flags(defaults: list[str], extra: tuple[str, ...]) -> list[str]:
    """`defaults` (`--flag=value` words) less the flags `extra` sets again, then `extra`: nsys refuses a flag
    given twice."""
    given = {word.split("=", 1)[0] for word in extra if word.startswith("-")}
    return [word for word in defaults if word.split("=", 1)[0] not in given] + list(extra)


def _run_nsys(cmd: list[str], output: Path, nsys, nsys_args: tuple[str, ...], capture: bool) -> ProgramRun:
    report, sqlite = output.with_name(output.name + REPORT_SUFFIX), output.with_name(output.name + ".sqlite")
    _refuse_existing([report, sqlite])
    check_output(report)
    ranged = capture and torch.cuda.is_available()
    partial = output.with_name(f".{output.name}.partial-{os.getpid()}")
    defaults = [*NSYS_PROGRAM_ARGS[1:], *(CAPTURE_ARGS if ranged else ())]
    profile = [str(nsys.path), NSYS_PROGRAM_ARGS[0], *merge_flags(defaults, nsys_args), "--force-overwrite=true",
               f"--output={partial}", *cmd]
    what = "the marked steps, or all from the first CUDA call" if ranged else "the whole run"
    console_err.print(f"nsys {nsys.version_str} records {what}: {shlex.join(cmd)}", soft_wrap=True,
                      markup=False, highlight=False)
    code = _run(profile, _env({RECORD: "nsys"} if ranged else {}))
    written = partial.with_name(partial.name + REPORT_SUFFIX)
    if not written.is_file():
        why = " (the program never opened the cudaProfilerApi range: no CUDA call)" if ranged else ""
        if code != 0:
            return ProgramRun(tuple(cmd), "nsys", code, "none", (), ())
        raise NsysError(f"nsys made no report{why}; see its output above")
    try:
        publish(written, report, overwrite=False)
    finally:
        written.unlink(missing_ok=True)
    sqlite = export_sqlite(report, nsys)
    capture_kind = "cudaProfilerApi" if ranged else "none"
    return ProgramRun(tuple(cmd), "nsys", code, capture_kind, (report, sqlite), (sqlite,))
