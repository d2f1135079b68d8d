"""One training-step workload shared by the benchmark, the nsys/torch profilers and the memory recorder.

A step runs `forward`, then `backward`, then `optimizer_step` (AdamW), each in a phase range of that name, as far
as the mode asks. Callers observe phase boundaries through `on_phase_end(phase)`: the benchmark records a CUDA
event there, the memory recorder reads the allocator's peak.

`compile` compiles the model block by block: every block runs one compiled code (compiled once, so compile time
does not grow with depth), and the backward ends one block at a time. With `cuda_graphs` each compiled block's
forward and backward replay as CUDA graphs (torch.compile's "reduce-overhead").

With `optimizer_overlap` each block's parameters have an optimizer of their own, stepped as soon as the block's
gradients are final, beside the backward of the blocks before it (`overlap.BlockOptimizers`); the
`optimizer_step` phase is then what is left of the update once the backward has ended. `cuda_graphs` then
captures the whole step, updates included, as one CUDA graph (`step_graph.StepGraph`), whose replays record the
phase boundaries as `phase_events()`. Gradient clipping needs every gradient first: with `clip_grad_norm` the
blocks' updates run after the backward, and `notes` says so.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from profiler_kit import distributed
from profiler_kit.device import free_memory, resolve_device
from profiler_kit.errors import ProfilerKitError
from profiler_kit.model import ATTENTION_IMPLS, TransformerLM
from profiler_kit.names import (
    BACKWARD,
    FORWARD,
    MASTER_WEIGHTS,
    OPTIMIZER_KWARGS,
    OPTIMIZER_STEP,
    OPTIMIZERS,
    phases_for,
)
from profiler_kit.names import MODES as MODES  # re-exported: the workload's names, also read from here
from profiler_kit.names import PHASES as PHASES
from profiler_kit.nvtx_ranges import nvtx_range, set_enabled
from profiler_kit.overlap import BlockOptimizers, block_groups
from profiler_kit.presets import DEFAULT_BATCH_SIZE, from_name
from profiler_kit.step_graph import StepGraph, on_stream

# AdamW settings of a typical LM run; they do not change the step's cost.
ADAMW_LR = 1e-4
ADAMW_WEIGHT_DECAY = 0.1


def limit_memory(device: torch.device, gib: float) -> None:
    """Cap what this process's caching allocator may hold on `device` at `gib` GiB (or the whole GPU, if
    smaller): a config then runs out of memory where it would on a GPU of that size."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, gib * 2**30 / total), index)


@dataclass(frozen=True)
class WorkloadConfig:
    """One benchmark/profiling configuration."""

    model: str
    ctx: int
    mode: str = "train"
    batch_size: int = DEFAULT_BATCH_SIZE
    mixed_precision: bool = False
    compile: bool = False
    attention: str = "naive"
    device: str = "auto"
    seed: int = 0
    nvtx: bool = True
    optimizer: str = "adamw-fused"
    loss_chunk_rows: int | None = None  # see `model.linear_cross_entropy`
    parallel: str = "none"  # none | ddp | fsdp: data-parallel under torchrun (profiler_kit.distributed)
    cuda_graphs: bool = False  # with `compile`: the compiled forward and backward replay as CUDA graphs
    optimizer_overlap: bool = False  # train: each block's update beside the backward (see the module docstring)
    clip_grad_norm: float | None = None  # train: the gradients' total norm clipped to this before the update
    memory_limit_gib: float | None = None  # CUDA: the caching allocator may hold at most this much, as a smaller GPU

    def validate(self) -> None:
        for field in ("ctx", "batch_size"):
            if getattr(self, field) <= 0:
                raise ProfilerKitError(f"{field} must be positive, got {getattr(self, field)}")
        if self.attention not in ATTENTION_IMPLS:
            raise ProfilerKitError(
                f"unknown attention {self.attention!r}; choose from {', '.join(ATTENTION_IMPLS)}"
            )
        if self.optimizer not in OPTIMIZERS:
            raise ProfilerKitError(f"unknown optimizer {self.optimizer!r}; choose from {', '.join(OPTIMIZERS)}")
        if self.cuda_graphs and not self.compile:
            raise ProfilerKitError("CUDA graphs come from the compiler: --cuda-graphs needs --compile")
        if self.optimizer == MASTER_WEIGHTS and not self.mixed_precision:
            raise ProfilerKitError(f"{MASTER_WEIGHTS} keeps bf16 weights for bf16 autocast: add --mixed-precision")
        if self.optimizer == MASTER_WEIGHTS and self.parallel != "none":
            raise ProfilerKitError(f"{MASTER_WEIGHTS} runs on one device: drop --parallel or pick a torch AdamW")
        if self.optimizer_overlap and self.mode != "train":
            raise ProfilerKitError("the optimizer beside the backward needs a train step: --mode train")
        if self.optimizer_overlap and self.parallel != "none":
            raise ProfilerKitError("the optimizer beside the backward runs on one device: drop --parallel")
        if self.clip_grad_norm is not None and self.clip_grad_norm <= 0:
            raise ProfilerKitError(f"clip_grad_norm must be positive, got {self.clip_grad_norm}")
        if self.memory_limit_gib is not None and self.memory_limit_gib <= 0:
            raise ProfilerKitError(f"memory_limit_gib must be positive, got {self.memory_limit_gib}")
        if self.memory_limit_gib is not None and resolve_device(self.device).type != "cuda":
            raise ProfilerKitError("--memory-limit-gib caps CUDA memory: it needs a CUDA device")
        phases_for(self.mode)
        distributed.check_mode(self.parallel)
        from_name(self.model, self.ctx)

    def tag(self) -> str:
        """File-name stem: `<model>_ctx<ctx>_<mode>[_bf16][_ddp|_fsdp]`."""
        parallel = "" if self.parallel == "none" else f"_{self.parallel}"
        return f"{self.model}_ctx{self.ctx}_{self.mode}" + ("_bf16" if self.mixed_precision else "") + parallel

    def as_dict(self) -> dict:
        return asdict(self)


class Workload:
    """Model, optimizer and a fixed random batch on one device, ready to run steps."""

    def __init__(self, cfg: WorkloadConfig) -> None:
        cfg.validate()
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        self.rank = 0
        if cfg.parallel != "none":
            self.device, place = distributed.join(self.device)
            self.rank = place.rank
        if cfg.memory_limit_gib is not None:
            limit_memory(self.device, cfg.memory_limit_gib)
        self.phases = phases_for(cfg.mode)
        set_enabled(cfg.nvtx)
        torch.manual_seed(cfg.seed)
        self.model_cfg = from_name(cfg.model, cfg.ctx)
        with self.device:  # build in place: initialising billions of weights on the host first is slow
            core = TransformerLM(self.model_cfg, attention=cfg.attention, loss_chunk_rows=cfg.loss_chunk_rows)
        model = core if cfg.parallel == "none" else distributed.wrap(core, cfg.parallel, self.device,
                                                                     cfg.mixed_precision)
        self.model = model
        self.notes: list[str] = []
        whole_graph = cfg.cuda_graphs and cfg.optimizer_overlap
        if cfg.compile:
            # "reduce-overhead" records each block's compiled forward and backward as CUDA graphs and replays them:
            # one launch each instead of one per kernel, for steps whose host time exceeds their GPU time.
            mode = "reduce-overhead" if cfg.cuda_graphs and not whole_graph else None
            for layer in core.layers:
                layer.compile(mode=mode)
        self.optimizer = None
        self.blocks: BlockOptimizers | None = None
        self.optimizer_step: Callable[[], object] | None = None
        if OPTIMIZER_STEP in self.phases:
            make = self._optimizer_factory(capturable=whole_graph)
            if cfg.optimizer_overlap:
                self.blocks = BlockOptimizers(block_groups(model), make)
                self.optimizer_step = self.blocks.step
                if cfg.clip_grad_norm is not None:
                    self.notes.append("gradient clipping needs every gradient: the optimizer ran after the backward")
            else:
                self.optimizer = make(list(model.parameters()))
                # The compiler fuses the foreach and loop updates into a few kernels; the others are one already.
                compile_step = cfg.compile and cfg.optimizer in ("adamw-foreach", "adamw")
                self.optimizer_step = torch.compile(self.optimizer.step) if compile_step else self.optimizer.step
        self.beside_backward = self.blocks is not None and cfg.clip_grad_norm is None
        # The step's own stream, of a higher priority than the one the updates beside the backward run on:
        # wherever both wait for the GPU, the backward's kernels go first.
        self.stream = torch.cuda.Stream(self.device, priority=-1) if (
            cfg.optimizer_overlap and self.device.type == "cuda") else None
        self.graph: StepGraph | None = None
        if whole_graph and self.stream is not None:
            after = [self.blocks.write_captured_tables] if self.blocks is not None else []
            self.graph = StepGraph(self._step, self.device, self.phases, self.stream,
                                   release=lambda: self.model.zero_grad(set_to_none=True), after_capture=after)
        # Same weights on every rank (same seed above), a batch of its own on each.
        generator = torch.Generator(device="cpu").manual_seed(cfg.seed + self.rank)
        shape = (cfg.batch_size, cfg.ctx + 1)
        data = torch.randint(0, self.model_cfg.vocab_size, shape, generator=generator)
        self.inputs = data[:, :-1].to(self.device)
        self.targets = data[:, 1:].to(self.device)

    def _optimizer_factory(self, capturable: bool) -> Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]:
        """What makes the optimizer of some parameters: the configured AdamW (`capturable`: its step may be
        captured in a CUDA graph)."""
        if self.cfg.optimizer == MASTER_WEIGHTS:  # turns the model's weights into bf16
            from profiler_kit.master_weights import MasterWeightAdamW  # imports Triton: only when asked

            return lambda params: MasterWeightAdamW(params, lr=ADAMW_LR, weight_decay=ADAMW_WEIGHT_DECAY)
        kwargs = {**OPTIMIZER_KWARGS[self.cfg.optimizer], **({"capturable": True} if capturable else {})}
        return lambda params: torch.optim.AdamW(params, lr=ADAMW_LR, weight_decay=ADAMW_WEIGHT_DECAY, **kwargs)

    def autocast(self) -> contextlib.AbstractContextManager:
        if not self.cfg.mixed_precision:
            return contextlib.nullcontext()
        # A captured step keeps no cast weights from one autocast region to the next.
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, cache_enabled=self.graph is None)

    def phase_events(self) -> list[torch.cuda.Event] | None:
        """With the step captured as one CUDA graph: the events its last replay recorded, at the step's start and
        at each phase's end (else None: the phases end where the step calls `on_phase_end`)."""
        return self.graph.events if self.graph is not None else None

    def step(self, on_phase_end: Callable[[str], None] | None = None) -> torch.Tensor:
        """Run one step; returns the detached loss tensor (no host sync: read it outside timed regions; with
        `cuda_graphs`, before the next step, whose replay reuses its memory)."""
        if self.graph is not None:
            return self.graph(on_phase_end)
        if self.stream is not None:
            return on_stream(self.stream, lambda: self._step(on_phase_end))
        if self.cfg.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        return self._step(on_phase_end)

    def _step(self, on_phase_end: Callable[[str], None] | None) -> torch.Tensor:
        self.model.zero_grad(set_to_none=True)
        with nvtx_range(FORWARD, marked=True):
            with self.autocast():
                loss = self.model(self.inputs, self.targets)
        if on_phase_end:
            on_phase_end(FORWARD)
        if BACKWARD in self.phases:
            if self.beside_backward:
                self.blocks.arm()
            with nvtx_range(BACKWARD, marked=True):
                loss.backward()
            if on_phase_end:
                on_phase_end(BACKWARD)
        if self.optimizer_step is not None:
            with nvtx_range(OPTIMIZER_STEP, marked=True):
                if self.beside_backward:
                    self.blocks.finish()
                else:
                    if self.cfg.clip_grad_norm is not None:
                        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip_grad_norm)
                    self.optimizer_step()
            if on_phase_end:
                on_phase_end(OPTIMIZER_STEP)
        return loss.detach()


def release(workload: Workload | None) -> None:
    """Drop a workload's tensors and give cached GPU memory back (after an OOM, before the next config)."""
    if workload is not None:
        workload.optimizer = workload.optimizer_step = workload.blocks = workload.graph = None
        workload.model = None
        if workload.cfg.compile:
            # Drop the compiled code and its CUDA graphs: the next config compiles afresh (a sweep would
            # otherwise reach dynamo's recompile limit and run eagerly) on memory the graphs no longer hold.
            torch._dynamo.reset()
    free_memory()
