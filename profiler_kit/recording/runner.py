"""Running a program under a recorder: `profiler-kit nsys [--backend torch] -- COMMAND`, `profiler-kit memory --
COMMAND` (backend `memory`), and the built-in workload, which is started as one more program (`builtin`).

Every backend runs the command with `profiler_kit/recording/_inject` first on PYTHONPATH, whose `sitecustomize`
sets up the recorder in every Python process of it (`child`; under torchrun in each worker, not in torchrun),
so the program needs no change. nsys backend: `nsys profile --trace=cuda,nvtx COMMAND`, with a
`cudaProfilerApi` capture range on a machine with CUDA (the program's window, see `recorders`), one report
for the whole job, then the SQLite export. torch backend: torch.profiler in each process, one trace per rank.
memory backend: the CUDA memory history instead (`history`), one snapshot per rank. Each recorded process
says what it recorded in its window file (`channel`), which becomes the run's `ParentWindow`. This side of the
recording never imports torch.

The program runs in a process group of its own: a signal this process gets (Ctrl-C, SIGTERM, SIGHUP) goes to
the whole group, a second one kills it, and what the program left running when it ended is stopped. Its
output goes to stderr, so that stdout carries only the summary; its exit status comes back unchanged (128 + N
for death by signal N, as a shell says). The outputs are reserved when the run starts (`files.reserve_output`):
a concurrent run with the same output fails at once, an existing one is refused unless `force`. The recording
is made under a temporary name and put in place when complete, so a failed run leaves earlier files as they
were.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import glob
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from profiler_kit.defaults import DEFAULT_MODULES
from profiler_kit.environment import note
from profiler_kit.errors import ProfilerKitError
from profiler_kit.files import publish, reserve_output
from profiler_kit.names import RECORDING_BACKENDS
from profiler_kit.nsys_tool import NsysError, NsysInstall, export_sqlite, find_nsys, kill_group, output_tail
from profiler_kit.recording.channel import (
    CUDA,
    JOB_DIR,
    MAX_ENTRIES,
    MODULES,
    RANKS_ONLY,
    RECORD,
    SNAPSHOT_SUFFIX,
    TRACE,
    TRACE_SUFFIX,
    WHOLE_RUN,
    WINDOW,
    read_windows,
    trace_path,
)
from profiler_kit.recording.cost import recording_cost
from profiler_kit.render import say

BACKENDS = RECORDING_BACKENDS
MEMORY = "memory"
NO_CUDA_HISTORY = "CUDA memory history needs a CUDA device"
INJECT_DIR = Path(__file__).resolve().parent / "_inject"
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
# Fewer options than nsys's defaults: no CPU sampling or context switches, which would grow the report and
# need perf_event permissions, and nothing recorded but CUDA API/kernels/memory operations and NVTX. Kernels
# that a CUDA graph replays are recorded one by one, as the program launched them when it captured.
NSYS_PROFILE_ARGS = ("--trace=cuda,nvtx", "--sample=none", "--cpuctxsw=none", "--cuda-graph-trace=node")
CAPTURE_ARGS = ("--capture-range=cudaProfilerApi", "--capture-range-end=stop")
LAUNCHERS = ("torchrun",)
REPORT_SUFFIX = ".nsys-rep"
# The extensions each backend's recording adds to the output path; an output given with one means the same.
RECORDING_SUFFIXES = {"nsys": (REPORT_SUFFIX, ".sqlite"), "torch": (TRACE_SUFFIX,), MEMORY: (SNAPSHOT_SUFFIX,)}
# How long what the program left running may hold its output open once it ended, before it is stopped.
LEFTOVER_S = 5.0
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
ERROR_PREFIX = "error: "
# Lines of the program's output kept for an error message.
TAIL_LINES = 20


@dataclass(frozen=True)
class ParentWindow:
    """The parent's half of the window (the child's is `window.ChildWindow`): what a recording holds, the whole
    run, the steps `profiler_kit.capture` marked, or the program's own `torch.cuda.profiler` window; how many
    steps (None when the program has no steps); and what each recorded process said of it: its rank, its steps'
    times (`[number, ms, recorded]`) and what it could not record."""

    kind: str
    steps: int | None = None
    nvtx_dropped: bool = False  # nsys ignored the `nvtx` package's ranges (see `child.nvtx_reaches_tool`)
    step_ms: tuple[tuple[int, float, bool], ...] = ()
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        steps = "" if self.steps is None else f", {self.steps} step{'s' if self.steps != 1 else ''}"
        what = {"whole run": "the whole run", "profiler_kit.capture": "the steps profiler_kit.capture marks",
                "torch.cuda.profiler": "the program's torch.cuda.profiler.start()/stop() window"}
        return f"recorded {what.get(self.kind, self.kind)}{steps}"

    def cost(self) -> str | None:
        """What recording cost the program, when its recorded and unrecorded steps tell (`cost`)."""
        return recording_cost(self.step_ms)

    def summary_notes(self) -> list[str]:
        """The lines a summary of this recording shows."""
        return [self.describe(), *filter(None, [self.cost()]), *self.notes]


@dataclass(frozen=True)
class ProgramRun:
    """What profiling a command gave: its exit status, the files written, the ones to summarize (the SQLite
    export, or one Chrome trace per process: per rank under torchrun), the window recorded, the lines the
    program printed that start with `error: `, and the last lines of its output, in one line."""

    command: tuple[str, ...]
    backend: str
    exit_code: int
    window: ParentWindow
    files: tuple[Path, ...]
    sources: tuple[Path, ...]
    errors: tuple[str, ...] = field(default=())
    tail: str = ""


@functools.lru_cache(maxsize=1)
def cuda_device_present() -> bool:
    """Whether this machine has a CUDA device the program can use, asked of the CUDA driver itself (`cuInit`,
    `cuDeviceGetCount`, which honour CUDA_VISIBLE_DEVICES): this side of the recording never loads torch."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    count = ctypes.c_int(0)
    return driver.cuInit(0) == 0 and driver.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0


def choose_recorder(nsys_path: str | os.PathLike | None = None) -> tuple[str, str]:
    """The best recorder of this machine for any program, and one line that says which and why: nsys when it is
    found (`nsys_path`, else where `find_nsys` looks) and a CUDA device is present, else torch.profiler (nsys
    without a GPU records no CPU operators). An nsys named by `nsys_path` or $NSYS that is not one is an error."""
    gpu = cuda_device_present()
    try:
        nsys = find_nsys(nsys_path)
    except NsysError:
        if nsys_path or os.environ.get("NSYS"):
            raise
        nsys = None
    if nsys is not None and gpu:
        return "nsys", f"recorder: Nsight Systems {nsys.version_str} ({nsys.path}): a CUDA device is present"
    if nsys is not None:
        return "torch", (f"recorder: torch.profiler: no CUDA device here, and nsys {nsys.version_str} "
                         f"({nsys.path}) would record no CPU operators; the tables show CPU operator time")
    if gpu:
        return "torch", ("recorder: torch.profiler: no nsys found (PATH, $NSYS, $CUDA_HOME, the CUDA and Nsight "
                         "install folders); install Nsight Systems or pass --nsys PATH to record under it")
    return "torch", "recorder: torch.profiler: no CUDA device and no nsys here; the tables show CPU operator time"


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


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """This environment with the injected sitecustomize and this package first on PYTHONPATH."""
    path = os.environ.get("PYTHONPATH")
    parts = [str(INJECT_DIR), str(PACKAGE_ROOT)] + ([path] if path else [])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(parts), **extra}


def exit_status(returncode: int) -> int:
    """A process's exit status as a shell gives it: 128 + N for death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


# What kineto prints when the recorder starts and stops torch.profiler (in every process, every rank): not the
# program's, so not relayed.
KINETO_NOISE = re.compile(r"^USDT:\S+ \S+ \S+ \S+\] profiler_(?:start|stop)\s*$")


class _Output:
    """The program's output, copied line by line to our stderr, its `error: ` lines kept and kineto's start and
    stop lines (KINETO_NOISE) dropped; and what its recorded processes said of their windows (`channel`)."""

    def __init__(self) -> None:
        self.windows: list[dict] = []
        self.errors: list[str] = []
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)

    def pump(self, stream) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace")
            if KINETO_NOISE.match(line):
                continue
            if line.startswith(ERROR_PREFIX):
                self.errors.append(line[len(ERROR_PREFIX):].strip())
            self.tail.append(line)
            sys.stderr.write(line)
            sys.stderr.flush()

    def window(self) -> ParentWindow:
        """What the first recorded process (rank 0 when ranks are known) said it recorded, with every
        process's notes; the whole run when none said."""
        if not self.windows:
            return ParentWindow(WHOLE_RUN)
        ranked = len(self.windows) > 1
        first = min(self.windows, key=lambda w: w.get("rank") if isinstance(w.get("rank"), int) else 1 << 30)
        steps = first.get("steps")
        times = tuple((int(n), float(ms), bool(on)) for n, ms, on in _triples(first.get("step_ms")))
        notes = [f"rank {w.get('rank')}: {line}" if ranked else line
                 for w in self.windows for line in w.get("notes") or [] if isinstance(line, str)]
        return ParentWindow(str(first.get("kind", WHOLE_RUN)), steps if isinstance(steps, int) else None,
                      first.get("nvtx_dropped") is True, times, tuple(dict.fromkeys(notes)))

    def result(self, cmd: list[str], backend: str, code: int, files: tuple[Path, ...],
               sources: tuple[Path, ...]) -> ProgramRun:
        return ProgramRun(tuple(cmd), backend, code, self.window(), files, sources, tuple(self.errors),
                          output_tail("".join(self.tail)))


def _triples(value: object) -> list[list]:
    """The `[number, ms, recorded]` entries of a window file's `step_ms` that have that shape."""
    if not isinstance(value, list):
        return []
    return [item for item in value if isinstance(item, list) and len(item) == 3
            and isinstance(item[0], int) and isinstance(item[1], (int, float))]


def run_child(cmd: Sequence[str], env: dict[str, str]) -> tuple[int, _Output]:
    """Run `cmd` in a process group of its own (see the module docstring); its exit status and output, with
    the window files its recorded processes left in the folder `env[JOB_DIR]`, when it names one."""
    output = _Output()
    try:
        proc = subprocess.Popen(list(cmd), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as exc:
        raise ProfilerKitError(f"could not run {cmd[0]}: {exc.strerror or exc}") from None
    reader = threading.Thread(target=output.pump, args=(proc.stdout,), daemon=True)
    reader.start()
    signalled: list[int] = []

    def forward(sig: int, _frame: object) -> None:
        signalled.append(sig)
        kill_group(proc.pid, signal.SIGKILL if len(signalled) > 1 else sig)

    main_thread = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, forward) for sig in SIGNALS} if main_thread else {}
    try:
        returncode = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    reader.join(LEFTOVER_S)
    kill_group(proc.pid, signal.SIGKILL)  # anything of the program's still running, e.g. a hung recorder
    reader.join()
    proc.stdout.close()
    if env.get(JOB_DIR):
        output.windows = read_windows(env[JOB_DIR])
    return exit_status(returncode), output


def run_program(command: list[str], backend: str, output: Path | None = None,
                nsys_path: str | os.PathLike | None = None, nsys_args: tuple[str, ...] = (),
                capture: bool = True, force: bool = False, max_entries: int | None = None,
                modules: str = DEFAULT_MODULES) -> ProgramRun:
    """Run `command` under `backend` (nsys, torch or memory), writing `<output>.nsys-rep` and `.sqlite`, or
    `<output>.json.gz`, or `<output>.pickle` (`<output>.rank<R>.json.gz`/`.pickle` per torchrun worker).
    `capture` False records the whole run under nsys even when the program opens a window; `force` replaces
    existing outputs; `max_entries` is the memory history's ring size; `modules` the module marks (`depth:N`,
    `all`, `none`). `output` may end with the extension the
    backend adds (`out.json.gz` is `out`). The memory backend needs CUDA: without it nothing starts."""
    if backend not in (*BACKENDS, MEMORY):
        raise ProfilerKitError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
    if backend == MEMORY:
        if not cuda_device_present():
            raise ProfilerKitError(NO_CUDA_HISTORY)
        if max_entries is None or max_entries < 1:
            raise ProfilerKitError(f"max_entries must be at least 1, got {max_entries}")
    cmd = resolve_command(command)
    output = recording_stem(Path(output), backend) if output is not None else default_output(command)
    if backend == "torch":
        return _run_in_process(cmd, output, force, "torch", TRACE_SUFFIX, {MODULES: modules})
    if backend == MEMORY:
        output.parent.mkdir(parents=True, exist_ok=True)
        return _run_in_process(cmd, output, force, MEMORY, SNAPSHOT_SUFFIX,
                               {MAX_ENTRIES: str(max_entries), MODULES: modules})
    nsys = find_nsys(nsys_path)
    note("nsys", nsys.version_str)
    return _run_nsys(cmd, output, nsys, nsys_args, capture, force, modules)


def recording_stem(output: Path, backend: str) -> Path:
    """`output` less the extension `backend`'s recording adds, when it ends with one (`-o out/p1.json.gz`)."""
    for suffix in RECORDING_SUFFIXES[backend]:
        if output.name.endswith(suffix) and len(output.name) > len(suffix):
            return output.with_name(output.name.removesuffix(suffix))
    return output


def _partial(output: Path) -> Path:
    return output.with_name(f".{output.name}.partial-{os.getpid()}")


def _rank_of(path: Path) -> int:
    rank = path.name.removesuffix(TRACE_SUFFIX).removesuffix(SNAPSHOT_SUFFIX).rsplit(".rank", 1)[-1]
    return int(rank) if rank.isdigit() else -1


def _run_in_process(cmd: list[str], output: Path, force: bool, backend: str, suffix: str,
                    settings: dict[str, str]) -> ProgramRun:
    """Run `cmd` with a recorder inside each of its Python processes (torch or memory), each writing
    `<output><suffix>`, or, under a launcher, `<output>.rank<R><suffix>`: only the files of that kind are
    refused when they exist (a one-process run writes no rank's file)."""
    if _is_launcher(cmd):
        ranked = sorted(output.parent.glob(f"{glob.escape(output.name)}.rank*{suffix}"), key=_rank_of)
        first, others = trace_path(output, 0, suffix), tuple(p for p in ranked if _rank_of(p) != 0)
    else:
        first, others = trace_path(output, None, suffix), ()
    with reserve_output(first, force, others), tempfile.TemporaryDirectory(prefix="profiler-kit-job-") as job:
        partial = _partial(output)
        extra = {RECORD: backend, TRACE: str(partial.absolute()), JOB_DIR: job, **settings}
        if cuda_device_present():
            extra[CUDA] = "1"
        if _is_launcher(cmd):
            extra[RANKS_ONLY] = "1"
        what = "torch.profiler" if backend == "torch" else "CUDA memory history"
        say(f"{what}: {shlex.join(cmd)}")
        written = sorted(partial.parent.glob(f"{glob.escape(partial.name)}*{suffix}"))
        for stale in written:  # another run of this process id's that died
            stale.unlink()
        try:
            code, out = run_child(cmd, child_env(extra))
            written = sorted(partial.parent.glob(f"{glob.escape(partial.name)}*{suffix}"))
            traces = []
            for path in written:
                final = output.with_name(output.name + path.name[len(partial.name):])
                publish(path, final, overwrite=force)
                traces.append(final)
        finally:
            for path in written:
                path.unlink(missing_ok=True)
    traces.sort(key=_rank_of)
    return out.result(cmd, backend, code, tuple(traces), tuple(traces))


def merge_flags(defaults: list[str], extra: tuple[str, ...]) -> list[str]:
    """`defaults` (`--flag=value` words) less the flags `extra` sets again, then `extra`: nsys refuses a flag
    given twice."""
    given = {word.split("=", 1)[0] for word in extra if word.startswith("-")}
    return [word for word in defaults if word.split("=", 1)[0] not in given] + list(extra)


def nsys_command(nsys: NsysInstall, output: Path, cmd: list[str], ranged: bool,
                 nsys_args: tuple[str, ...] = ()) -> list[str]:
    """`nsys profile ... COMMAND`, writing `<output>.nsys-rep`; `ranged` adds the cudaProfilerApi range."""
    defaults = [*NSYS_PROFILE_ARGS, *(CAPTURE_ARGS if ranged else ())]
    return [str(nsys.path), "profile", *merge_flags(defaults, nsys_args), "--force-overwrite=true",
            f"--output={output}", *cmd]


def _run_nsys(cmd: list[str], output: Path, nsys: NsysInstall, nsys_args: tuple[str, ...], capture: bool,
              force: bool, modules: str) -> ProgramRun:
    """nsys around the whole command, one report for the job: under a launcher every worker records for itself
    (the launcher does not) and opens the capture range, which closes when the last of them closes its
    window (they count themselves in the job's folder)."""
    report, sqlite = output.with_name(output.name + REPORT_SUFFIX), output.with_name(output.name + ".sqlite")
    with reserve_output(report, force, (sqlite,)), tempfile.TemporaryDirectory(prefix="profiler-kit-job-") as job:
        ranged = capture and cuda_device_present()
        partial = _partial(output)
        profile = nsys_command(nsys, partial, cmd, ranged, nsys_args)
        what = "the program's window, or all from the first CUDA call" if ranged else "the whole run"
        say(f"nsys {nsys.version_str} records {what}: {shlex.join(cmd)}")
        extra = {RECORD: "nsys", JOB_DIR: job, MODULES: modules, **({WINDOW: "1"} if ranged else {})}
        if _is_launcher(cmd):
            extra[RANKS_ONLY] = "1"
        env = child_env(extra)
        written = partial.with_name(partial.name + REPORT_SUFFIX)
        try:
            code, out = run_child(profile, env)
            if not written.is_file():
                if code != 0:
                    return out.result(cmd, "nsys", code, (), ())
                why = " (the program never opened its cudaProfilerApi window)" if ranged else ""
                raise NsysError(f"nsys made no report{why}; see its output above")
            if force:  # the export of the report replaced must never pass for this one's
                sqlite.unlink(missing_ok=True)
            publish(written, report, overwrite=force)
        finally:
            written.unlink(missing_ok=True)
            partial.with_name(partial.name + ".qdstrm").unlink(missing_ok=True)
        exported = export_sqlite(report, nsys)
    return out.result(cmd, "nsys", code, (report, exported), (exported,))


def nothing_recorded(backend: str, window: ParentWindow) -> str:
    """Why a recording holds no kernels and no operators, in one line."""
    if backend == "torch":
        why = (f"no PyTorch operator ran in {window.describe().removeprefix('recorded ')} (the program did no "
               "torch work there)")
    elif not cuda_device_present():
        why = ("no CUDA kernels: there is no CUDA device here, so the program did no CUDA work, and nsys records "
               "no CPU operators; record with --backend torch instead")
    else:
        why = f"no CUDA kernels in {window.describe().removeprefix('recorded ')}: the program did no CUDA work there"
    if window.nvtx_dropped:
        why += "; this nsys also dropped the ranges of the `nvtx` package (2022.4 does; a newer nsys records them)"
    return "nothing recorded: " + why
