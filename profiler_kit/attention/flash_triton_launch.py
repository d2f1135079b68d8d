"""How the Triton attention kernels are launched: autotuned, on a pinned config, interpreted, or straight into
the compiled kernel once the autotuner has chosen for a call's shapes.

Why the direct launch. A launch through `triton.autotune` and `JITFunction.run` spends its host time building
the tuning key, specialising every argument (~40 here, four of them TMA descriptors), hashing the result into
a cache key and reading Triton's knobs, before Triton's launcher runs. An attention forward is one such
launch and its backward three, so below N ≈ 8192 a fwd+bwd on an H100 took longer on the host than on the
GPU, and the host time was what a benchmark measured (docs/results/attention-h100.md, step 5).
`Kernel` therefore keeps, per call signature, what the first call resolved (the compiled kernel, the grid and
the constexpr values of the chosen config) and sends later calls with the same signature straight to the
compiled kernel's launcher, with the same arguments and hooks `JITFunction.run` would pass. On the H100 that
halved the launchers' host time (step 6 of the same document).

The signature must pin down everything Triton specialises a compilation on, or a kernel would run on
arguments it was not compiled for. Triton specialises pointers on 16-byte alignment and integers on being 1
or a multiple of 16; every integer argument of these kernels (lengths, heads, strides, the sequence bucket)
is a function of the input tensors' shapes and strides, and every output is allocated by the launchers from
those shapes. So a signature of the flags a launcher passes as constexprs plus, for each input tensor, its
shape, strides, dtype, device and pointer alignment (`tensor_signature`) is enough.
PROFILER_KIT_FLASH_DIRECT=0 switches the direct launch off, to measure what it saves.

Also here: which configs are offered (shared-memory pruning, where warp specialisation is allowed, which grid
order the forward and dQ kernels run per shape), and when and how tiles move by TMA descriptors.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch
import triton

from profiler_kit.attention import flash_cpp

try:  # Triton ≥ 3.4; without it every tile moves through pointers.
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - depends on the installed Triton
    TensorDescriptor = None
try:  # Triton ≥ 3.4 (its launch hooks live here); without it every launch goes through the autotuner.
    from triton import knobs
    from triton.runtime import driver
except ImportError:  # pragma: no cover - depends on the installed Triton
    knobs = driver = None

# Scores are kept in base-2 units: the softmax scale 1/√d is folded into log2(e) (see `flash_triton_fwd`).
LOG2E = math.log2(math.e)
# Read once, like Triton itself does when @triton.jit runs.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
AUTOTUNE_ENV = "PROFILER_KIT_FLASH_AUTOTUNE"
DIRECT_ENV = "PROFILER_KIT_FLASH_DIRECT"
# Shared memory one block may use on H100 (227 KiB); configs estimated above it are not compiled at all.
SMEM_BUDGET_BYTES = 227 * 1024
TUNING_KEY = ["HEAD_DIM", "CAUSAL", "TMA", "SEQ_BUCKET"]


def block_d(head_dim: int) -> int:
    """The tile's head dim: the next power of two ≥ d (tl.arange and tl.dot need powers of two ≥ 16)."""
    return max(triton.next_power_of_2(head_dim), 16)


def ws_allowed(elem_bytes: int, head_dim: int, tma: bool) -> bool:
    """Where warp-specialised configs are offered: the only case where they compiled and won a tuning sweep
    (Triton 3.6, H100: 16-bit, d = 128, TMA loads, 8 warps). Elsewhere they are pruned, because a config
    that fails to compile (the 4-warp ones did) would end the autotuner's run instead of losing to the others."""
    return elem_bytes == 2 and head_dim == 128 and tma


def regs_allowed(head_dim: int) -> bool:
    """Where configs with the "regs" flag (resident tiles in registers) are offered: d ≤ 64. At d = 128 the
    dK/dV kernel's K and V then take 64 more registers per thread and it spills (248 bytes); there every
    such config lost, by 12–60% (H100, docs/results/attention-h100.md, step 19)."""
    return head_dim <= 64


def head_first_wanted(head_dim: int, causal: bool) -> bool:
    """The grid order of the forward and dQ kernels: head-first where it won, i.e. causal at d ≤ 64, and tiles
    first elsewhere, where programs that run together share K and V in the L2.

    On the H100 the head-first twin of a config was faster on the causal d = 64 leaderboard shape (median
    ×0.956 forward and ×0.978 dQ over 23 and 21 configs) and slower by 1–24% at d = 128
    (docs/results/attention-h100.md, steps 9 and 14). Offering both orders let the autotuner choose between
    twins whose short timings overlap and whose sustained times do not (step 13: 1.27 against 1.33 ms).
    """
    return causal and head_dim <= 64


# Heads per group of a causal launch's tiles-first grid (`flash_triton_fwd.grid_position`). A list-scheduling
# model of the causal d = 128 shapes of issue 6 (64 heads of 32 or 64 tiles, one or two blocks per SM) puts the
# makespan of one head after another 5–7% above its ideal and that of groups of 4–8 heads within 0.2% of it;
# 4 heads of K and V at N = 4096, d = 128 take 8 MB of the L2. On the H100, groups of 1, 2, 4 and 8 gave that
# shape's best forward 0.578, 0.578, 0.551, 0.557 ms and best backward 1.836, 1.818, 1.769, 1.785 ms
# (docs/results/attention-h100.md, step 20).
CAUSAL_HEAD_GROUP = 4


def head_group(causal: bool) -> int:
    """The HEAD_GROUP constexpr of the tiled kernels: CAUSAL_HEAD_GROUP when causal, else 1 (every program of a
    non-causal launch does the same work, so one head after another loses nothing and shares the most L2)."""
    return CAUSAL_HEAD_GROUP if causal else 1


def smem_pruner(resident: tuple[str, ...], streamed: tuple[str, ...], order_by_shape: bool = False) -> Callable:
    """An `early_config_prune` keeping the configs whose tiles fit in SMEM_BUDGET_BYTES (warp-specialised
    ones only where `ws_allowed`, "regs" ones only where `regs_allowed`; with `order_by_shape`, only those on
    the grid order `head_first_wanted` picks, where the list offers any).

    `resident` names the block sizes of the (rows × BLOCK_D) tiles a program loads once, `streamed` those the
    pipeliner keeps `num_stages` copies of. For these kernels the estimate equals Triton's allocation for the
    forward and over-counts the backward a little; Triton rejects (OutOfResources) whatever slips through.
    """

    def smem_bytes(config: triton.Config, elem: int, width: int) -> int:
        once = sum(config.kwargs[r] for r in resident)
        pipelined = config.num_stages * sum(config.kwargs[r] for r in streamed)
        return (once + pipelined) * width * elem

    def prune(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
        elem, width = named_args["Q"].element_size(), block_d(kwargs["HEAD_DIM"])
        if not ws_allowed(elem, kwargs["HEAD_DIM"], kwargs["TMA"]):
            configs = [c for c in configs if not c.kwargs["WS"]]
        if not regs_allowed(kwargs["HEAD_DIM"]):
            configs = [c for c in configs if not c.kwargs["REGS"]]
        if order_by_shape:
            wanted = head_first_wanted(kwargs["HEAD_DIM"], kwargs["CAUSAL"])
            configs = [c for c in configs if c.kwargs["HEAD_FIRST"] == wanted] or configs
        kept = [c for c in configs if smem_bytes(c, elem, width) <= SMEM_BUDGET_BYTES]
        # The autotuner refuses an empty list: fall back to the smallest config.
        return kept or [min(configs, key=lambda c: smem_bytes(c, elem, width))]

    return prune


# Each descriptor argument's block is (1, 1, rows, BLOCK_D), with rows the block size named here; the
# descriptors of (Z·H, seq) per-row statistics take blocks of (1, rows).
DESCRIPTOR_ROWS = {"DESC_Q": "BLOCK_M", "DESC_O": "BLOCK_M", "DESC_DO": "BLOCK_M", "DESC_K": "BLOCK_N",
                    "DESC_V": "BLOCK_N", "DESC_LSE2": "BLOCK_M", "DESC_DELTA": "BLOCK_M"}


def size_descriptors(nargs: dict) -> None:
    """Give the TMA descriptors among a launch's arguments the block shape of the config about to run.

    A config pre_hook: the descriptors are made once per call, before the autotuner picks block sizes.
    """
    for name, rows in DESCRIPTOR_ROWS.items():
        desc = nargs.get(name)
        if desc is not None:
            desc.block_shape = [1, nargs[rows]] if len(desc.shape) == 2 else [1, 1, nargs[rows], nargs["BLOCK_D"]]


# The config flags a shape tuple may name, and the constexpr each one sets (all off unless named).
CONFIG_FLAGS = {"ws": "WS", "head_first": "HEAD_FIRST", "overlap": "OVERLAP", "regs": "REGS"}


def configs(shapes: list[tuple], params: list[str]) -> list[triton.Config]:
    """Autotune configs from (BLOCK_M, BLOCK_N, warps, stages, *flags) tuples for a kernel with parameters
    `params`; flags are names of `CONFIG_FLAGS` whose constexpr the kernel declares, and each such constexpr
    the kernel declares is set (off unless named). A flag "maxnreg=R" caps the registers per thread at R, so
    that more blocks fit on an SM, at the price of spills.

    "ws" (warp specialisation) splits a key/query loop between producer warps issuing the loads and consumer
    warps doing the math, where Triton can partition it. "head_first" launches a (Z·H, tiles) grid instead
    of (tiles, Z·H), so that the longest causal tiles of all heads start before any shorter one (see
    `tile_program`). "overlap" issues a matmul that does not depend on the exp2 before it, so that the
    tensor cores work while the exp2 runs (the dK/dV kernel's OVERLAP says which matmul). "regs" feeds the
    matmuls of the resident tiles (q; k and v; q and dO) from registers, not shared memory (see
    `flash_triton_fwd.register_operand`).
    """
    known = {name: const for name, const in CONFIG_FLAGS.items() if const in params}
    out = []
    for m, n, w, s, *flags in shapes:
        caps = [f for f in flags if isinstance(f, str) and f.startswith("maxnreg=")]
        flags = [f for f in flags if f not in caps]
        unknown = set(flags) - set(known)
        if unknown:
            raise ValueError(f"config flags {sorted(unknown, key=str)} not offered here; known: {sorted(known)}")
        switches = {const: name in flags for name, const in known.items()}
        out.append(triton.Config({"BLOCK_M": m, "BLOCK_N": n, **switches}, num_warps=w, num_stages=s,
                                 maxnreg=int(caps[-1].split("=")[1]) if caps else None, pre_hook=size_descriptors))
    return out


def grid_2d(tiles: int, heads: int, meta: dict) -> tuple[int, int]:
    """The launch grid of a kernel with `tiles` tiles per batch·head, in the order the config asks for."""
    return (heads, tiles) if meta.get("HEAD_FIRST") else (tiles, heads)


@functools.cache
def _has_tma(device: torch.device) -> bool:
    """Compute capability 9.0+ (asked once per device: this sits on every attention call's path)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def tma_usable(*tensors: torch.Tensor) -> bool:
    """Whether the kernels may move these tensors' tiles by TMA: a GPU of compute capability 9.0+ (or the
    interpreter), Triton's TensorDescriptor, 16-bit data (fp32 configs already fill shared memory without
    TMA's buffers) and 16-byte aligned base pointers and strides."""
    first = tensors[0]
    if TensorDescriptor is None or first.element_size() != 2 or not (INTERPRET or _has_tma(first.device)):
        return False
    return all(
        t.data_ptr() % 16 == 0 and all(stride > 0 and stride * t.element_size() % 16 == 0 for stride in t.stride()[:-1])
        for t in tensors
    )


def descriptors(*tensors: torch.Tensor) -> list:
    """A TMA descriptor per (Z, H, seq, d) tensor; block shapes are set per launch by `size_descriptors`."""
    return [TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, 16, 16]) for t in tensors]


def row_descriptors(*tensors: torch.Tensor) -> list:
    """A TMA descriptor per (Z·H, seq) fp32 tensor of per-row statistics; blocks are (1, rows)."""
    return [TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 16]) for t in tensors]


def tensor_signature(t: torch.Tensor) -> tuple:
    """What Triton's specialisation can see of a tensor argument and of the integers derived from it."""
    return t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0


@dataclass(frozen=True)
class _Plan:
    """A resolved launch: the compiled kernel, its grid and the constexprs that follow the runtime arguments.

    TMA descriptors need no block shape here: the compiled kernel's launcher takes it from the kernel's own
    metadata, not from the descriptor object.
    """

    compiled: object  # triton.compiler.CompiledKernel
    grid: tuple[int, int, int]
    tail: tuple
    config: triton.Config | None
    cpp: tuple | None = None  # the launch as `flash_cpp.launch_spec` describes it, when that path is on

    def launch(self, args: tuple) -> None:
        """What `JITFunction.run` does once its cache has the kernel: the same launcher, arguments and hooks."""
        kernel = self.compiled
        stream = driver.active.get_current_stream(driver.active.get_current_device())
        full = (*args, *self.tail)
        kernel.run(*self.grid, stream, kernel.function, kernel.packed_metadata,
                   kernel.launch_metadata(self.grid, stream, *full),
                   knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *full)


class Kernel:
    """A @triton.jit kernel and the ways to launch it. With `shapes` it is autotuned over `configs(shapes)`,
    pruned by `pruner`; `interpret_blocks` are the fixed block sizes used under the interpreter."""

    def __init__(self, fn, shapes: list[tuple] | None = None, pruner: Callable | None = None,
                 interpret_blocks: dict | None = None) -> None:
        self.fn = fn
        self.shapes = list(shapes or [])
        self.pruner = pruner
        self.interpret_blocks = interpret_blocks or {}
        self.tuned = None
        if shapes:
            self.tuned = triton.autotune(configs=configs(shapes, fn.arg_names), key=TUNING_KEY,
                                         prune_configs_by={"early_config_prune": pruner})(fn)
        self.last_config: triton.Config | None = None
        self.last_plan: _Plan | None = None  # the plan the last call ran or made; None after a pinned launch
        self._plans: dict[Hashable, _Plan] = {}

    @property
    def configs(self) -> list[triton.Config]:
        return self.tuned.configs if self.tuned else []

    @property
    def last_cpp_spec(self) -> tuple | None:
        """The C++ launch spec of the last call's plan (`flash_cpp.launch_spec`); None without one."""
        return self.last_plan.cpp if self.last_plan else None

    def tuning_cache(self) -> dict:
        """The autotuner's choice per tuning key so far."""
        return dict(self.tuned.cache) if self.tuned else {}

    def __call__(self, grid: Callable[[dict], tuple], args: tuple, consts: dict, signature: Hashable = None,
                 config: triton.Config | None = None) -> None:
        """Launch on `args` (the runtime arguments, in signature order) and `consts` (the constexprs that are
        not block sizes). `grid` maps a config's block sizes to the launch grid.

        Tuned (the default): the first call with a `signature` goes through Triton's autotuner and remembers
        what it ran; later calls with that signature launch it directly. `config` pins a config instead (for
        tuning sweeps); with PROFILER_KIT_FLASH_AUTOTUNE=0 the first config that fits runs; the interpreter
        runs `interpret_blocks`.
        """
        self.last_plan = None
        if INTERPRET or config is not None or (self.tuned and os.environ.get(AUTOTUNE_ENV, "1") == "0"):
            self._launch_pinned(grid, args, consts, config)
            return
        direct = signature is not None and knobs is not None and os.environ.get(DIRECT_ENV, "1") != "0"
        plan = self._plans.get(signature) if direct else None
        if plan is not None:
            plan.launch(args)
            self.last_config, self.last_plan = plan.config, plan
            return
        compiled = (self.tuned or self.fn)[grid](*args, **consts)
        self.last_config = self.tuned.best_config if self.tuned else None
        if direct:
            plan = self._plan(compiled, grid, args, consts)
            if plan is not None:
                self._plans[signature] = self.last_plan = plan

    def _plan(self, compiled, grid: Callable[[dict], tuple], args: tuple, consts: dict) -> _Plan | None:
        """The plan of the launch Triton just made; None when this Triton's compiled kernels cannot be
        launched directly (or the arguments do not cover the kernel's parameters)."""
        meta = self.last_config.kwargs if self.last_config else {}
        values = {**consts, **meta}
        tail_names = self.fn.arg_names[len(args):]
        usable = all(hasattr(compiled, a) for a in ("run", "function", "packed_metadata", "launch_metadata"))
        if not usable or any(name not in values for name in tail_names):
            return None
        size = tuple(grid(meta))
        grid3 = (*size, *(1,) * (3 - len(size)))
        tail = tuple(values[n] for n in tail_names)
        cpp = None
        if flash_cpp.ENABLED:
            cpp = flash_cpp.launch_spec(compiled, grid3, dict(zip(self.fn.arg_names, (*args, *tail), strict=True)))
        return _Plan(compiled, grid3, tail, self.last_config, cpp)

    def _launch_pinned(self, grid: Callable[[dict], tuple], args: tuple, consts: dict,
                       config: triton.Config | None) -> None:
        """One config, without the autotuner: `config`, else the interpreter's blocks, else the first that
        fits. A config's pre_hook (it sizes TMA descriptors) runs as the autotuner would run it."""
        if not self.tuned:
            self.fn[grid({})](*args, **consts)
            return
        nargs = dict(zip(self.fn.arg_names, args, strict=False))
        if INTERPRET:
            config = triton.Config(self.interpret_blocks)
        elif config is None:
            config = self.pruner(self.tuned.configs, nargs, **consts)[0]
        meta = config.kwargs
        # Every config of a tuned kernel shares one pre_hook; a config pinned by the caller may not carry it.
        pre_hook = self.tuned.configs[0].pre_hook
        if pre_hook is not None:
            pre_hook({**nargs, **consts, **meta})
        options = {} if INTERPRET else {"num_warps": config.num_warps, "num_stages": config.num_stages}
        self.fn[grid(meta)](*args, **consts, **meta, **options)
