"""How the Triton attention kernels are launched: autotuned, on a pinned config, interpreted, or straight into
the compiled kernel once the autotuner has chosen for a call's shapes; and when tiles move by TMA descriptors.

Why the direct launch. A launch through `triton.autotune` and `JITFunction.run` spends its host time building
the tuning key, specialising every argument (~40 here, four of them TMA descriptors), hashing the result into
a cache key and reading Triton's knobs; an attention forward is one such launch and its backward three, so on
short sequences the host time is what a call costs. `Kernel` therefore keeps, per call signature, what the
first call resolved (the compiled kernel, the grid and the constexpr values of the chosen config) and sends
later calls with the same signature straight to the compiled kernel's launcher, with the same arguments and
hooks `JITFunction.run` would pass.

The signature must pin down everything Triton specialises a compilation on, or a kernel would run on
arguments it was not compiled for. Triton specialises pointers on 16-byte alignment and integers on being 1
or a multiple of 16; every integer argument of these kernels (lengths, heads, strides, the sequence bucket)
is a function of the input tensors' shapes and strides, and every output is allocated by the launchers from
those shapes. So a signature of the flags a launcher passes as constexprs plus, for each input tensor, its
shape, strides, dtype, device and pointer alignment (`tensor_signature`) is enough.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch
import triton

from profiler_kit.attention.options import INTERPRET, FlashOptions
from profiler_kit.attention.record import KernelLaunch, LaunchRecord
from profiler_kit.attention.triton_kernels.configs import TUNING_KEY, configs, describe

try:  # Triton ≥ 3.4; without it every tile moves through pointers.
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - depends on the installed Triton
    TensorDescriptor = None
try:  # Triton ≥ 3.4 (its launch hooks live here); without it every launch goes through the autotuner.
    from triton import knobs
    from triton.runtime import driver
except ImportError:  # pragma: no cover - depends on the installed Triton
    knobs = driver = None


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


def record(kernel: str | None, config: triton.Config | None) -> LaunchRecord:
    """The launch record of one tuned kernel's launch (empty for a kernel without a role or config)."""
    return LaunchRecord((KernelLaunch(kernel, describe(config)),) if kernel and config is not None else ())


@dataclass(frozen=True)
class _Plan:
    """A resolved launch: the compiled kernel, its grid, the arguments that the signature fixes and the launch
    record.

    The kernels take their tensors (and TMA descriptors) first and integers after them; the integers are
    functions of the signature (see the module docstring), so a plan keeps them with the constexprs that
    follow, and a later call passes only its first `per_call` arguments. TMA descriptors need no block shape
    here: the compiled kernel's launcher takes it from the kernel's own metadata, not from the descriptor.
    """

    compiled: object  # triton.compiler.CompiledKernel
    grid: tuple[int, int, int]
    per_call: int
    fixed: tuple
    config: triton.Config | None
    record: LaunchRecord

    def launch(self, per_call: tuple) -> None:
        """What `JITFunction.run` does once its cache has the kernel: the same launcher, arguments and hooks."""
        kernel = self.compiled
        stream = driver.active.get_current_stream(driver.active.get_current_device())
        full = (*per_call, *self.fixed)
        kernel.run(*self.grid, stream, kernel.function, kernel.packed_metadata,
                   kernel.launch_metadata(self.grid, stream, *full),
                   knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *full)


class Kernel:
    """A @triton.jit kernel and the ways to launch it. With `shapes` it is autotuned over `configs(shapes)`,
    pruned by `pruner`; `interpret_blocks` are the fixed block sizes used under the interpreter. `role` names
    the kernel in launch records ("fwd", "dkdv", "dq"; None: left out of them)."""

    def __init__(self, fn, shapes: list[tuple] | None = None, pruner: Callable | None = None,
                 interpret_blocks: dict | None = None, role: str | None = None) -> None:
        self.fn = fn
        self.role = role
        self.shapes = list(shapes or [])
        self.pruner = pruner
        self.interpret_blocks = interpret_blocks or {}
        self.tuned = None
        if shapes:
            self.tuned = triton.autotune(configs=configs(shapes, fn.arg_names), key=TUNING_KEY,
                                         prune_configs_by={"early_config_prune": pruner})(fn)
        self._plans: dict[Hashable, _Plan] = {}
        self._traceable: dict[tuple[int, ...], object] = {}  # hook-free autotuners by the configs they offer

    @property
    def configs(self) -> list[triton.Config]:
        return self.tuned.configs if self.tuned else []

    def tuning_cache(self) -> dict:
        """The autotuner's choice per tuning key so far."""
        return dict(self.tuned.cache) if self.tuned else {}

    def __call__(self, grid: Callable[[dict], tuple], args: tuple, consts: dict, signature: Hashable = None,
                 config: triton.Config | None = None, options: FlashOptions | None = None) -> triton.Config | None:
        """Launch on `args` (the runtime arguments, in signature order) and `consts` (the constexprs that are
        not block sizes); return the config that ran (None for a kernel without configs). `grid` maps a
        config's block sizes to the launch grid.

        Tuned (the default): the first call with a `signature` goes through Triton's autotuner and remembers
        what it ran; later calls with that signature launch it directly (unless `options.direct_launch` is
        off). `config` pins a config instead (for tuning sweeps); with `options.autotune` off the first config
        that fits runs; the interpreter runs `interpret_blocks`.
        """
        options = options or FlashOptions()
        if INTERPRET or config is not None or (self.tuned and not options.autotune):
            return self._launch_pinned(grid, args, consts, config)
        plan = None if signature is None else self.planned(signature, args, options)
        if plan is not None:
            return plan.config
        compiled = (self.tuned or self.fn)[grid](*args, **consts)
        chosen = self.tuned.best_config if self.tuned else None
        if signature is not None and knobs is not None and options.direct_launch:
            plan = self._plan(compiled, grid, args, consts, chosen)
            if plan is not None:
                self._plans[signature] = plan
        return chosen

    def planned(self, signature: Hashable, args: tuple, options: FlashOptions) -> _Plan | None:
        """Launch the plan an earlier call with this `signature` resolved, on this call's arguments, and return
        it; None, launching nothing, where there is no plan or the options rule direct launches out. The plan
        reads only the leading tensor (and descriptor) arguments, so the launchers' short path passes those
        alone, without computing the integers."""
        if INTERPRET or knobs is None or not options.direct_launch or (self.tuned and not options.autotune):
            return None
        plan = self._plans.get(signature)
        if plan is not None:
            plan.launch(args[:plan.per_call])
        return plan

    def launch_traced(self, grid: Callable[[dict], tuple], args: tuple, consts: dict,
                      options: FlashOptions | None = None) -> triton.Config | None:
        """Launch through `torch.library.wrap_triton`, for `torch.compile` tracing the attention operators
        (`attention.op`): the graph then holds this kernel. A tuned kernel offers Inductor the configs that fit,
        to time (only the first with `options.autotune` off), without their pre_hook, which Inductor does not
        run: the arguments must hold no TMA descriptors. Returns the first config offered."""
        from torch.library import wrap_triton

        if not self.tuned:
            wrap_triton(self.fn)[grid({})](*args, **consts)
            return None
        nargs = dict(zip(self.fn.arg_names, args, strict=False))
        candidates = self.pruner(self.tuned.configs, nargs, **consts)
        if not (options or FlashOptions()).autotune:
            candidates = candidates[:1]
        key = tuple(self.tuned.configs.index(c) for c in candidates)
        if key not in self._traceable:
            hookless = [triton.Config(c.kwargs, num_warps=c.num_warps, num_stages=c.num_stages, maxnreg=c.maxnreg)
                        for c in candidates]
            self._traceable[key] = triton.autotune(configs=hookless, key=[])(self.fn)
        wrap_triton(self._traceable[key])[grid](*args, **consts)
        return candidates[0]

    def _plan(self, compiled, grid: Callable[[dict], tuple], args: tuple, consts: dict,
              config: triton.Config | None) -> _Plan | None:
        """The plan of the launch Triton just made; None when this Triton's compiled kernels cannot be
        launched directly (or the arguments do not cover the kernel's parameters)."""
        meta = config.kwargs if config else {}
        values = {**consts, **meta}
        tail_names = self.fn.arg_names[len(args):]
        usable = all(hasattr(compiled, a) for a in ("run", "function", "packed_metadata", "launch_metadata"))
        if not usable or any(name not in values for name in tail_names):
            return None
        size = tuple(grid(meta))
        grid3 = (*size, *(1,) * (3 - len(size)))
        per_call = next((i for i, a in enumerate(args) if isinstance(a, (int, float))), len(args))
        fixed = (*args[per_call:], *(values[n] for n in tail_names))
        return _Plan(compiled, grid3, per_call, fixed, config, record(self.role, config))

    def _launch_pinned(self, grid: Callable[[dict], tuple], args: tuple, consts: dict,
                       config: triton.Config | None) -> triton.Config | None:
        """One config, without the autotuner: `config`, else the interpreter's blocks, else the first that
        fits. A config's pre_hook (it sizes TMA descriptors) runs as the autotuner would run it."""
        if not self.tuned:
            self.fn[grid({})](*args, **consts)
            return None
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
        run_options = {} if INTERPRET else {"num_warps": config.num_warps, "num_stages": config.num_stages}
        self.fn[grid(meta)](*args, **consts, **meta, **run_options)
        return config
