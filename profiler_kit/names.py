"""The names the command line offers, importable without torch, pandas or numpy (every `--help` reads them): the
workload's modes, phases and optimizers, the attention implementations, the recorders and data-parallel modes,
the gates of `kernels compare` and the phase rule; and the vocabulary of ranges that recorders write and readers
read (the phase names, the range kinds, the NVTX domain of profiler-kit's own ranges, the ranges PyTorch and
libraries open). `workload`, `attention.registry`, `nvtx_ranges`, the recorders, `recording.runner`, `kernels`,
the memory analysis and `benchmark` build on them; the defaults are in `defaults`."""

from __future__ import annotations

import re

from profiler_kit.errors import ProfilerKitError

MODES = ("forward", "forward-backward", "train")
# The phases of a training step: the built-in workload's `profiler_kit.phase` ranges and the recorder's
# automatic marks of any program share these names; `step` names one step of the program.
FORWARD, BACKWARD, OPTIMIZER_STEP, STEP = "forward", "backward", "optimizer_step", "step"
PHASES = (FORWARD, BACKWARD, OPTIMIZER_STEP)
# An evaluation pass the recorder's marks found after the program's last training step (`phase_rule.evaluation`):
# a phase of its own, no step.
EVAL = "eval"
# The kind of a range (the `kind` column of a report's ranges): opened with `profiler_kit.phase`; placed by the
# recorder itself (the automatic marks, and the steps of `profiler_kit.capture`); any other (the program's own,
# its libraries', PyTorch's).
KIND_PHASE, KIND_AUTO, KIND_PROGRAM = "phase", "auto", "program"
RANGE_KINDS = (KIND_PHASE, KIND_AUTO, KIND_PROGRAM)
# profiler-kit's NVTX domain: phases are pushed in it, automatic marks are start/end ranges of its category
# AUTO_CATEGORY (a step's number as the int64 payload), and each recorded process marks its place in the job
# (PROCESS_CATEGORY: a mark `rank=R world_size=W local_rank=L node=N`).
MARK_DOMAIN = "profiler_kit"
AUTO_CATEGORY = "auto"
PROCESS_CATEGORY = "process"
# Where no domain can carry them (torch.profiler traces, memory snapshots, torch.cuda.nvtx), automatic marks are
# named with this prefix, a step's number after `#`: `profiler_kit::forward`, `profiler_kit::step#3`.
AUTO_PREFIX = "profiler_kit::"
# The module marks (`recording.modules`): each module call is a start/end range of the domain, its path in the
# outermost module's `named_modules()` as the message (`blocks.3.attn`), in the category of what ran: the
# module's forward, its backward (on the autograd thread), or its forward run again inside a backward
# (activation-checkpoint recomputation). Where no domain carries them: `profiler_kit::<category>::<path>`.
MODULE_CATEGORY, MODULE_BACKWARD_CATEGORY, MODULE_RECOMPUTE_CATEGORY = "module", "module_backward", "module_recompute"
MODULE_CATEGORIES = (MODULE_CATEGORY, MODULE_BACKWARD_CATEGORY, MODULE_RECOMPUTE_CATEGORY)
# The recording's module metadata (each path's type, the compiled modules, FLOPs per module), one JSON object:
# the `modules` entry of a trace's or snapshot's `profiler_kit` metadata; under nsys the text of the latest mark
# of the domain's category `modules` in each process (`profiler_kit::modules <JSON>` where no domain carries it).
MODULES_KEY = "modules"
# `--modules`: module marks down to a depth (`blocks` is depth 1, `blocks.3.attn` depth 3), at every depth, or none.
MODULE_DEPTH_ALL, MODULE_DEPTH_NONE = "all", "none"
# torch.compile's own events in a torch.profiler trace: its timed stages (`_compile.compile_inner (dynamo_timed)`,
# `compile_fx_inner (dynamo_timed)`, as operators) and their records with the compile id (`dynamo_data:
# compile_id=0/1`, as `record_function` ranges).
COMPILE_EVENT = re.compile(r"^(?:.* \(dynamo_timed\)|[\w.<>]+_data: (?:.*, )?compile_id=\d.*)$")
# Ranges PyTorch and libraries open by themselves, never a program's phases: the optimizer's methods, the
# profiler's steps, DDP/FSDP wrappers, operators, autograd nodes, collectives (NCCL's own NVTX ranges, c10d,
# gloo), CUB's and Thrust's algorithms (CCCL's NVTX ranges, e.g. around an embedding's backward sort), compiled
# regions, and the recorder's own marks where they carry their prefix.
LIBRARY_RANGES = re.compile(
    r"^(?:Optimizer\.|ProfilerStep#|aten::|c10d::|gloo:|nccl|autograd::|DistributedDataParallel\.|"
    r"FullyShardedDataParallel|FSDP::|Torch-Compiled Region|CompiledFunction|## |cub::|thrust::|"
    + re.escape(AUTO_PREFIX) + r")|" + COMPILE_EVENT.pattern
)
# Top-level ranges that hold no step of the program, never phases.
NOT_PHASES = ("warmup",)
# torch's AdamW implementations: one fused kernel chain, multi-tensor (foreach) kernels, or a loop over the
# parameters; then AdamW on fp32 master weights of a model held in bf16 (`master_weights`).
OPTIMIZER_KWARGS = {"adamw-fused": {"fused": True}, "adamw-foreach": {"foreach": True}, "adamw": {"foreach": False}}
MASTER_WEIGHTS = "adamw-master"
OPTIMIZERS = (*OPTIMIZER_KWARGS, MASTER_WEIGHTS)
ATTENTION_IMPLS = ("naive", "compiled", "sdpa", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "flash",
                   "flash-torch", "flash-triton", "flash-op")

# The recorders of `profiler-kit nsys` and the data-parallel modes of the built-in workload.
RECORDING_BACKENDS = ("nsys", "torch")
PARALLEL_MODES = ("none", "ddp", "fsdp")

# What `kernels compare --fail-above` can check.
GATES = ("total", "phases", "categories", "kernels")

PHASE_RULE = (
    "Phases: the --phase ranges when given (asked); else the ranges opened with profiler_kit.phase (marked); "
    "else the program's own ranges (torch.cuda.nvtx, nvtx, record_function) on each process's main thread: the "
    "outermost ones, or, when those all have one name (a `step`), the ranges directly inside them (program); "
    "else the recorder's automatic marks forward, backward, optimizer_step (auto). PyTorch's and libraries' "
    "ranges (Optimizer.*, ProfilerStep#…, aten::…, autograd::…, nccl…, c10d::…, DDP's, FSDP's) are never "
    "phases; `warmup` is never a phase."
)


def module_depth(setting: str) -> int | None:
    """The depth a `--modules` setting asks for: `depth:N` → N (at least 1), `all` → None (every depth),
    `none` → 0 (no module marks)."""
    if setting == MODULE_DEPTH_ALL:
        return None
    if setting == MODULE_DEPTH_NONE:
        return 0
    number = setting.removeprefix("depth:")
    if number == setting or not number.isdigit() or int(number) < 1:
        raise ProfilerKitError(f"--modules {setting!r}: expected depth:N (N at least 1), all or none")
    return int(number)


def phases_for(mode: str) -> tuple[str, ...]:
    """The phases a step of `mode` runs, in order."""
    if mode not in MODES:
        raise ProfilerKitError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    return PHASES[: MODES.index(mode) + 1]


# The tables each report can print, by name (`--table` picks one for CSV, `--csv-dir` names its files, a JSON
# made of tables keys them): a report prints those it has rows for. `--table` is checked against them before
# any work.
KERNEL_TABLES = ("categories", "top_kernels", "phases", "steps", "idle", "sub_ranges", "memory_ops", "nvtx_ranges")
RANK_TABLES = ("ranks", "nodes", "categories", "communication", "stragglers", "arrivals", "made_wait", "failed")
COMPARE_TABLES = ("categories", "phases", "top_kernels", "one_side_only", "gate")
WHATIF_TABLES = ("phases", "steps")
MEMORY_TABLES = ("peak_memory", "peak_allocated_per_step_and_phase", "peaks_per_phase",
                 "allocated_at_the_peak_by_role", "largest_allocations_alive_at_the_peak",
                 "expected_vs_measured_tensor_sizes")
MEMORY_RANK_TABLES = ("peak_per_rank", "allocated_at_the_highest_rank_s_peak_by_role_against_the_lowest_rank_s")
MEMORY_COMPARE_TABLES = ("peaks", "peak_allocated_per_phase", "allocated_at_the_peak_by_role")
# A kernel summary of one process, or of several ranks; a memory report of one snapshot, or of several ranks.
SUMMARY_TABLES = tuple(dict.fromkeys(KERNEL_TABLES + RANK_TABLES))
MEMORY_REPORT_TABLES = MEMORY_TABLES + MEMORY_RANK_TABLES
# The columns of the kernel and memory reports' tables that carry no unit. A name with a unit (UNIT_SUFFIXES)
# may be a column named after a phase or a category of the report (`fwd_ms`, `matmul_pct`, `forward_peak_mib`).
REPORT_COLUMNS = frozenset({
    "#", "allocated_in", "allocs_in_trace", "bytes_each", "bytes_per_param_at_peak", "category", "check",
    "collective_calls", "collectives", "completed", "count", "count_at_peak", "dtype", "end_event", "error",
    "evidence", "expected_count", "formula", "function", "instances", "kernel", "kernels", "last_rank", "lateness",
    "metric", "name", "names", "node", "operation", "operators", "path", "peak_event", "peak_phase", "phase",
    "position", "ranges", "rank", "regressed", "role", "size_bytes", "slowest_rank", "source", "speedup",
    "start_event", "startup_times_last", "state", "status", "step", "steps", "steps_last", "sub_range", "tensor",
    "times_last", "user_metadata", "verdict", "verdict_measured", "verdict_predicted", "where", "z_score",
})
UNIT_SUFFIXES = ("_ms", "_us", "_pct", "_mib")


def report_column(name: str) -> bool:
    """Whether `name` may be a column of a kernel or memory report's table (`--columns` before any work)."""
    return name in REPORT_COLUMNS or name.endswith(UNIT_SUFFIXES)
