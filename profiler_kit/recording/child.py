"""The recorder inside a profiled program (`profiler-kit nsys [--model ...] [-- COMMAND]`, `profiler-kit memory
[--model ...] [-- COMMAND]`), set up in one place.

The parent process describes what to record in environment variables (the only channel into a program it
does not control, and one that torchrun passes on to its workers, `channel`); `install_from_environment` reads
them once, in the `sitecustomize` that the parent puts first on PYTHONPATH:

    PROFILER_KIT_RECORD       torch: record with torch.profiler; nsys: the program runs under nsys;
                              memory: record the CUDA memory history (`history`)
    PROFILER_KIT_TRACE        torch, memory: where the trace or snapshot goes, without `.json.gz`/`.pickle`
    PROFILER_KIT_MAX_ENTRIES  memory: the history's ring size
    PROFILER_KIT_WINDOW       nsys with a cudaProfilerApi capture range: open it (`recorders`); else whole run
    PROFILER_KIT_RANKS_ONLY   1: record only processes that have a RANK (torchrun's workers, not torchrun)
    PROFILER_KIT_JOB_DIR      the run's folder: each process's window file; under nsys, the count of closed windows
    PROFILER_KIT_CUDA         torch: 1 when the machine has a CUDA device (a whole run starts again at the first
                              CUDA call)
    PROFILER_KIT_MODULES      the module marks: depth:N, all or none (`modules`; default defaults.DEFAULT_MODULES)

Every instrument is installed the same way whatever records: the guard and notes (`notes`), the window and its
step clock (`window`), the automatic marks (`marks`) with the module marks and their FLOPs (`modules`,
`module_flops`), the mirrors of the program's own ranges (`mirror`), the pause before the program closes its
process group (`teardown`); then the recorder the parent asked for (the contract every recorder keeps:
`recorder.Recorder`). They all hear the one stream of range events (`nvtx_ranges.observe`).
Each recorded process writes its window file when it is done (what it recorded, its steps and their times,
what it could not record), which the parent reads (`channel`).
"""

from __future__ import annotations

import atexit
import os
import warnings
from collections.abc import Mapping

from profiler_kit import nvtx_ranges
from profiler_kit.defaults import DEFAULT_MODULES
from profiler_kit.errors import ProfilerKitError
from profiler_kit.names import MODULES_KEY, module_depth
from profiler_kit.recording import api, mirror, module_flops, teardown
from profiler_kit.recording.channel import (
    CUDA,
    ENV_KEYS,
    JOB_DIR,
    MAX_ENTRIES,
    MODULES,
    RANKS_ONLY,
    RECORD,
    SNAPSHOT_SUFFIX,
    TRACE,
    WINDOW,
    trace_path,
)
from profiler_kit.recording.marks import Marks
from profiler_kit.recording.modules import ModuleMarks
from profiler_kit.recording.notes import RECORDING_WINDOW, Notes
from profiler_kit.recording.recorder import Recorder
from profiler_kit.recording.recorders import JobStop, NsysRecorder, TorchRecorder
from profiler_kit.recording.window import ChildWindow

# Where a process sits in its job, as torchrun tells it: the metadata key for each variable.
PLACE = {"RANK": "rank", "WORLD_SIZE": "world_size", "LOCAL_RANK": "local_rank", "GROUP_RANK": "node"}
# torch warns once a model is compiled while global module hooks exist (the marks' own): the warning is ours,
# not the program's, and the hooks' extra call on the compiled wrapper is the outermost forward it marks.
_COMPILE_WARNING = r"Using `torch.compile\(module\)` when there are global hooks on modules"


def place_of(env: Mapping[str, str]) -> dict[str, int]:
    """The process's rank, world size, local rank and node (torchrun's RANK, WORLD_SIZE, LOCAL_RANK,
    GROUP_RANK), those it has."""
    return {key: int(env[var]) for var, key in PLACE.items() if env.get(var, "").isdigit()}


def install_from_environment(env: Mapping[str, str]) -> None:
    """Set up the instruments and the recorder `env` asks for in this process (see the module docstring)."""
    env = dict(env)
    backend = env.get(RECORD)
    # Under a launcher each worker records for itself; a process that is one rank already (the built-in
    # workload under torchrun) writes the file its parent named.
    ranked = env.get(RANKS_ONLY) == "1"
    rank = env.get("RANK") if ranked and env.get("WORLD_SIZE") else None
    if backend is None or (ranked and rank is None):
        return
    if backend not in ("torch", "nsys", "memory"):
        raise ValueError(f"{RECORD}={backend!r}: expected torch, nsys or memory")
    for key in ENV_KEYS:  # processes this one starts are not recorded again
        os.environ.pop(key, None)
    notes, place = Notes(), place_of(env)
    window = ChildWindow(notes, env.get(JOB_DIR), place.get("rank"))
    window.nvtx_dropped = not nvtx_reaches_tool()
    modules = module_marks(env.get(MODULES, DEFAULT_MODULES), notes, announce=backend == "nsys")
    marks = Marks(notes, modules)
    warnings.filterwarnings("ignore", message=_COMPILE_WARNING)
    marks.install()
    mirror.install(notes)
    teardown.install(notes)
    recorder: Recorder
    if backend == "torch":
        recorder = TorchRecorder(trace_path(env[TRACE], rank), window, marks, notes, place, env.get(CUDA) == "1")
    elif backend == "nsys":
        local = int(env["LOCAL_WORLD_SIZE"]) if env.get("LOCAL_WORLD_SIZE", "").isdigit() else 1
        recorder = NsysRecorder(window, marks, notes, place, env.get(WINDOW) == "1", JobStop(env.get(JOB_DIR), local))
    else:
        from profiler_kit.recording.history import MemoryRecorder

        recorder = MemoryRecorder(trace_path(env[TRACE], rank, SNAPSHOT_SUFFIX), int(env[MAX_ENTRIES]), window,
                                  marks, notes, place)
    for observer in [*window.observers(), *recorder.observers(), *module_observers(modules, notes)]:
        nvtx_ranges.observe(observer)
    if modules is not None:  # kept up to date in place until the recording is written
        recorder.describe({MODULES_KEY: modules.metadata})
    guarded = Guarded(recorder, notes)
    api.set_recorder(guarded)
    mirror.patch_cuda_profiler(guarded.program_start, guarded.program_stop)
    atexit.register(window.report)  # last at exit: says the window even when the recorder failed to
    recorder.begin()


def module_marks(setting: str, notes: Notes, announce: bool) -> ModuleMarks | None:
    """The module marks `setting` asks for (`depth:N`, `all`, `none`: None); a setting the parent should have
    refused is a note, not an error in the program."""
    try:
        depth = module_depth(setting)
    except ProfilerKitError as exc:
        notes.add(f"no module marks: {exc}")
        return None
    return ModuleMarks(notes, depth, announce) if depth != 0 else None


def module_observers(modules: ModuleMarks | None, notes: Notes) -> list:
    """The range-event observers of the module marks: the FLOP count, then the metadata mark at a step's end."""
    if modules is None:
        return []
    return [notes.guard(module_flops.WHAT, module_flops.StepFlops(modules, notes)), *modules.observers()]


class Guarded:
    """The recorder as `profiler_kit.capture`, the program's `torch.cuda.profiler` calls and the exit see it:
    each call under the guard (`notes`), so that a recorder failing to start or stop its window never stops
    the program."""

    def __init__(self, recorder: Recorder, notes: Notes) -> None:
        for name in ("declare", "start", "stop", "describe", "program_start", "program_stop"):
            setattr(self, name, notes.guard(RECORDING_WINDOW, getattr(recorder, name)))


def nvtx_reaches_tool() -> bool:
    """False when a tool such as nsys is attached (NVTX_INJECTION64_PATH) but the `nvtx` package records
    nothing: recent nvtx releases ask the tool `nvtxDomainIsEnabled`, which older nsys (Debian's 2022.4) do
    not answer, and then drop every range."""
    if nvtx_ranges.BACKEND != "nvtx" or not os.environ.get("NVTX_INJECTION64_PATH"):
        return True
    import nvtx

    return type(nvtx.get_domain()).__name__ != "DummyDomain"
