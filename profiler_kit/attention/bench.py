"""The attention benchmark: forward, backward and forward+backward time, TFLOP/s and memory of each attention
implementation over a sweep of batch × heads × seq × head dim × dtype.

Timing. On CUDA every number is a `triton.testing.do_bench` median with its 20th/80th percentiles (do_bench
flushes the L2 cache before each call and times with CUDA events). Elsewhere a host-clock fallback follows
do_bench's recipe (5 calls to estimate, warm-up and repetitions sized from `warmup_ms`/`rep_ms`, the same
quantiles), so the command and its tests run on a CPU. Gradients are reset to None outside the timed region.
With `rounds` > 1 the implementations of a shape are timed in interleaved rounds and their calls pooled
(`run_shape`): one reading of a host-bound shape moves with the host's state from one moment to the next, and
rounds share that drift among the implementations instead of handing it to one of them.
The forward is timed as training runs it, with inputs that require grad (autograd records the graph); the
backward alone replays one retained graph. `backward_thread` says where the backward passes ran: `engine` (the
default, as training runs them) on the autograd engine's CUDA device thread, or `caller`
(`torch.autograd.set_multithreading_enabled(False)`) on the calling thread. The engine's two thread switches
per call, to its device thread and back, take most of a host-bound forward+backward's time, for every
implementation alike; `caller` takes them out (docs/attention.md has the readings).
In fp32, PyTorch's matmuls (naive, compiled) run in full fp32 unless TF32 is enabled, while Triton's `tl.dot`
uses TF32: compare fp32 rows with that in mind.

FLOPs follow the FlashAttention-2 paper: a forward is 4·B·H·N²·d (two N×N×d matmuls), a backward 2.5× that
(five matmuls), both halved when causal; forward+backward is 3.5×.

Memory (CUDA only; None elsewhere), in MiB of allocated memory, measured on one forward/backward run after a
warm-up run (which compiles and autotunes): `mem_inputs_mib` after q, k, v and the output gradient exist;
`mem_before_bwd_mib` after the forward; `saved_mib` their difference, i.e. the output plus everything autograd
keeps for the backward; `fwd_peak_mib`/`bwd_peak_mib` the allocator's peak during each pass (absolute, inputs
included). `saved_analytic_mib` is the same quantity derived by hand (see `saved_bytes`), so the two columns
side by side show whether an implementation keeps what it should.

The implementations of a shape take the same inputs (seed 0). Each config fails on its own: an OOM gives status
`oom`, any other failure (an SDPA backend that cannot run the config, a head dim a kernel does not support)
status `error` with the message, and the sweep goes on. A flash-triton row's message names the kernels and
configs that ran (the launch record of its warm-up call).

The implementations and their names come from `registry`.
"""

from __future__ import annotations

import functools
import itertools
import statistics
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

import torch

from profiler_kit.attention.record import launch_record
from profiler_kit.attention.registry import (
    BENCH_IMPLS,
    DTYPES,
    MATERIALIZING_IMPLS,
    NAMES,
    AttentionFn,
    check_name,
    input_shape,
    make_impl,
)
from profiler_kit.device import device_label, free_memory, resolve_device, synchronize
from profiler_kit.errors import ProfilerKitError, first_line

# Every name `--impl` takes, in table order, and the default set.
IMPLS = NAMES
DEFAULT_IMPLS = BENCH_IMPLS
# Speedup columns are computed against each of these that is part of a run.
REFERENCE_IMPLS = ("naive", "sdpa-cudnn", "sdpa-flash")
TIMINGS = ("fwd", "bwd", "fwd_bwd")
# FLOPs of each timed pass relative to the forward (FlashAttention-2 paper counting).
PASS_FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}
QUANTILES = (0.5, 0.2, 0.8)
# do_bench estimates the per-call time from this many calls before sizing warm-up and repetitions.
ESTIMATE_CALLS = 5
LSE_BYTES = 4  # every flash-style kernel keeps its logsumexp in fp32
MIB = 2**20

KEY_COLUMNS = ("impl", "dtype", "causal", "batch", "heads", "seq", "d")
TIMING_COLUMNS = tuple(f"{t}_{s}" for t in TIMINGS for s in ("ms", "p20_ms", "p80_ms"))
TFLOPS_COLUMNS = tuple(f"{t}_tflops" for t in TIMINGS)
MEMORY_COLUMNS = ("mem_inputs_mib", "mem_before_bwd_mib", "saved_mib", "saved_analytic_mib", "fwd_peak_mib",
                  "bwd_peak_mib")
# What changes a measurement besides its config; `--resume` counts a row as done only when these match.
# Beyond these a sweep would run for days, or its inputs fit no device: refused before any work.
MAX_MEASURE_MS = 600_000
MAX_INPUT_BYTES = 2**40
SETTING_COLUMNS = ("device", "warmup_ms", "rep_ms", "rounds", "backward_thread")
COLUMNS = (*KEY_COLUMNS, "device", "status", "warmup_ms", "rep_ms", "rounds", "backward_thread", *TIMING_COLUMNS,
           *TFLOPS_COLUMNS, *MEMORY_COLUMNS, "message")


@dataclass(frozen=True)
class AttentionConfig:
    """One benchmarked case. `heads=None` means inputs without a head dimension: (batch, seq, d)."""

    impl: str
    dtype: str
    causal: bool
    batch: int
    heads: int | None
    seq: int
    d: int
    device: str = "auto"

    def __post_init__(self) -> None:
        size = 3 * self.batch_heads * self.seq * self.d * DTYPES.get(self.dtype, torch.float32).itemsize
        if size > MAX_INPUT_BYTES:
            raise ProfilerKitError(f"{self.impl} {self.dtype} batch {self.batch} heads {self.heads} seq {self.seq} "
                                   f"d {self.d}: its inputs alone take {size / 2**30:,.0f} GiB, more than the "
                                   f"{MAX_INPUT_BYTES // 2**30:,} GiB any device holds")

    @property
    def shape(self) -> tuple[int, ...]:
        return input_shape(self.batch, self.heads, self.seq, self.d)

    @property
    def batch_heads(self) -> int:
        return self.batch * (self.heads or 1)

    def as_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------------------------- analytics


def attention_flops(batch_heads: int, seq: int, d: int, causal: bool, timing: str = "fwd") -> float:
    """FLOPs of one pass over `batch_heads` (B·H) sequences, FlashAttention-2 paper counting."""
    forward = 4.0 * batch_heads * seq * seq * d
    return forward * PASS_FLOP_FACTOR[timing] / (2 if causal else 1)


def saved_bytes(impl: str, batch_heads: int, seq: int, d: int, dtype: torch.dtype, causal: bool) -> int:
    """Bytes that exist after the forward and not before: the output O plus what autograd keeps.

    Naive (`reference.naive_attention`): q@kᵀ is scaled by a Python float, which saves nothing, so the raw
    scores die at once; `masked_fill` keeps its N×N boolean mask (1 byte per entry, shared by the batch) when
    causal; the scaled/masked scores die after the softmax; the softmax keeps its result P, and P@v keeps P
    (the same tensor) and v (an input). So: P (B·H·N² elements) + O + the causal mask. `compiled` is given
    the same figure: Inductor's partitioner may save the scores and row statistics instead of P, of the same
    order; the measured column shows what it chose. Flash kernels (ours and SDPA's) keep O and an fp32
    logsumexp (B·H·N; the efficient backend pads N to a multiple of 32, a negligible difference).
    """
    element = torch.empty((), dtype=dtype).element_size()
    output = batch_heads * seq * d * element
    if impl in MATERIALIZING_IMPLS:
        return batch_heads * seq * seq * element + output + (seq * seq if causal else 0)
    return output + batch_heads * seq * LSE_BYTES


# ---------------------------------------------------------------------------------------------- timing


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float

    @classmethod
    def of(cls, samples_ms: list[float]) -> Timing:
        """The median and the 20th/80th percentiles of per-call times (linear interpolation, as do_bench)."""
        quantiles = torch.quantile(torch.tensor(samples_ms, dtype=torch.float64),
                                   torch.tensor(QUANTILES, dtype=torch.float64))
        return cls(*quantiles.tolist())


def _clock_samples(fn: Callable[[], object], warmup_ms: float, rep_ms: float,
                   grad_to_none: list[torch.Tensor]) -> list[float]:
    """do_bench's recipe with the host clock, for devices without CUDA events."""

    def timed_call() -> float:
        for t in grad_to_none:
            t.grad = None
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3

    estimate_ms = statistics.fmean(timed_call() for _ in range(ESTIMATE_CALLS))
    for _ in range(max(1, int(warmup_ms / estimate_ms))):
        timed_call()
    return [timed_call() for _ in range(max(1, int(rep_ms / estimate_ms)))]


def sample_ms(fn: Callable[[], object], device: torch.device, warmup_ms: float, rep_ms: float,
              grad_to_none: list[torch.Tensor] | None = None) -> list[float]:
    """Each timed call's ms: do_bench's own samples on CUDA (L2 flushed before each call, CUDA events), the
    host clock elsewhere."""
    grad_to_none = grad_to_none or []
    if device.type == "cuda":
        from triton.testing import do_bench

        return list(do_bench(fn, warmup=warmup_ms, rep=rep_ms, grad_to_none=grad_to_none, return_mode="all"))
    return _clock_samples(fn, warmup_ms, rep_ms, grad_to_none)


def bench_ms(fn: Callable[[], object], device: torch.device, warmup_ms: float, rep_ms: float,
             grad_to_none: list[torch.Tensor] | None = None) -> Timing:
    """Median, 20th and 80th percentile of `fn`'s time in ms (do_bench on CUDA, the host clock elsewhere)."""
    return Timing.of(sample_ms(fn, device, warmup_ms, rep_ms, grad_to_none))


def capture_graph(body: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """`body` captured into a CUDA graph (replay it to rerun its kernels on the same tensors), after the
    warm-up on a side stream that PyTorch's capture needs. Compile and autotune before: no capture can time."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        body()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    return graph


# ---------------------------------------------------------------------------------------------- one shape


def _reasons(caught: list[warnings.WarningMessage]) -> str:
    """torch's warnings (e.g. why an SDPA backend refused a config), without their source locations."""
    seen: list[str] = []
    for w in caught:
        text = str(w.message).split(" (Triggered internally", 1)[0].strip()
        if text and text not in seen:
            seen.append(text)
    return "; ".join(seen)


def _is_oom(exc: BaseException) -> bool:
    # cuDNN and cuBLAS report exhaustion as RuntimeErrors that mention it rather than as OutOfMemoryError.
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


def failure_fields(exc: BaseException, reasons: str = "") -> dict:
    """The status ("oom" or "error") and message of a config that raised `exc`; `reasons` (torch's warnings)
    are appended in brackets."""
    suffix = f" ({reasons})" if reasons else ""
    return {"status": "oom" if _is_oom(exc) else "error", "message": f"{first_line(exc)}{suffix}"}


def _measure_memory(fn: AttentionFn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    grad_out: torch.Tensor, device: torch.device) -> dict:
    synchronize(device)
    inputs = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = fn(q, k, v)
    synchronize(device)
    before_bwd = torch.cuda.memory_allocated(device)
    fwd_peak = torch.cuda.max_memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out.backward(grad_out)
    synchronize(device)
    bwd_peak = torch.cuda.max_memory_allocated(device)
    del out
    for t in (q, k, v):
        t.grad = None
    return {"mem_inputs_mib": inputs / MIB, "mem_before_bwd_mib": before_bwd / MIB,
            "saved_mib": (before_bwd - inputs) / MIB, "fwd_peak_mib": fwd_peak / MIB,
            "bwd_peak_mib": bwd_peak / MIB}


def _inputs(cfg: AttentionConfig, device: torch.device) -> tuple[torch.Tensor, ...]:
    """q, k, v (requiring grad) and the output gradient of a shape, the same for every implementation."""
    generator = torch.Generator(device=device).manual_seed(0)
    q, k, v, grad_out = (torch.randn(cfg.shape, dtype=DTYPES[cfg.dtype], device=device, generator=generator)
                         for _ in range(4))
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), grad_out


def _prepare(row: dict, cfg: AttentionConfig, inputs: tuple[torch.Tensor, ...],
             device: torch.device) -> AttentionFn:
    """The implementation, compiled, autotuned and warmed up on `inputs`, with its memory in `row`."""
    fn = make_impl(cfg.impl, cfg.causal, device)
    q, k, v, grad_out = inputs
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            # Compiles, autotunes, and surfaces configs an implementation cannot run, with torch's reasons.
            out = fn(q, k, v)
            out.backward(grad_out)
        except Exception:
            row["message"] = _reasons(caught)
            raise
    record = launch_record(out)
    if record is not None:
        # The kernels and configs this shape runs (the autotuner's picks, or the Gluon kernels).
        row["message"] = record.describe()
    del out
    for t in (q, k, v):
        t.grad = None
    if device.type == "cuda":
        row.update(_measure_memory(fn, q, k, v, grad_out, device))
    return fn


def _time_round(fn: AttentionFn, inputs: tuple[torch.Tensor, ...], samples: dict[str, list[float]],
                device: torch.device, warmup_ms: float, rep_ms: float, backward_on_caller: bool = False) -> None:
    """Append one round of forward, backward and forward+backward calls to `samples` (ms per call). With
    `backward_on_caller` the backward passes run on the calling thread instead of the autograd engine's device
    thread (`backward_thread` in the module docstring)."""
    q, k, v, grad_out = inputs
    params = [q, k, v]
    samples["fwd"] += sample_ms(lambda: fn(q, k, v), device, warmup_ms, rep_ms)
    with torch.autograd.set_multithreading_enabled(not backward_on_caller):
        # One graph backpropagated again and again; the output and what it saved live as long as this partial.
        backward_again = functools.partial(fn(q, k, v).backward, grad_out, retain_graph=True)
        samples["bwd"] += sample_ms(backward_again, device, warmup_ms, rep_ms, params)
        del backward_again
        samples["fwd_bwd"] += sample_ms(lambda: fn(q, k, v).backward(grad_out), device, warmup_ms, rep_ms, params)
    for t in params:
        t.grad = None


def _fill_timings(row: dict, cfg: AttentionConfig, samples: dict[str, list[float]]) -> None:
    """The timing and TFLOP/s columns of every pass that has samples (a failure keeps what came before it)."""
    for timing, times in samples.items():
        if not times:
            continue
        result = Timing.of(times)
        row.update({f"{timing}_ms": result.median_ms, f"{timing}_p20_ms": result.p20_ms,
                    f"{timing}_p80_ms": result.p80_ms,
                    f"{timing}_tflops": attention_flops(cfg.batch_heads, cfg.seq, cfg.d, cfg.causal, timing)
                    / result.median_ms / 1e9})


def settings(device: torch.device, warmup_ms: float, rep_ms: float, rounds: int = 1,
             backward_on_caller: bool = False) -> dict:
    """The values of SETTING_COLUMNS that a row measured with these arguments of `run_shape` has (what `--resume`
    matches); times beyond MAX_MEASURE_MS are refused, since every measurement would take that long."""
    for what, ms in (("warm-up", warmup_ms), ("measured", rep_ms)):
        if not 0 <= ms <= MAX_MEASURE_MS:
            raise ProfilerKitError(f"a {what} time of {ms:g} ms per measurement is outside 0 to {MAX_MEASURE_MS:,} "
                                   "ms (10 minutes), and every implementation and timing takes one")
    return {"device": device_label(device), "warmup_ms": warmup_ms, "rep_ms": rep_ms, "rounds": rounds,
            "backward_thread": "caller" if backward_on_caller else "engine"}


def _new_row(cfg: AttentionConfig, measured_with: dict) -> dict:
    row: dict = dict.fromkeys(COLUMNS)
    row.update({k: getattr(cfg, k) for k in KEY_COLUMNS})
    row.update(measured_with, message="",
               saved_analytic_mib=saved_bytes(cfg.impl, cfg.batch_heads, cfg.seq, cfg.d, DTYPES[cfg.dtype],
                                             cfg.causal) / MIB)
    return row


def shape_of(cfg: AttentionConfig) -> tuple:
    """What the implementations of one shape share: every field but the implementation."""
    return tuple(v for k, v in cfg.as_dict().items() if k != "impl")


def run_shape(cfgs: list[AttentionConfig], warmup_ms: float, rep_ms: float, rounds: int = 1,
              backward_on_caller: bool = False) -> list[dict]:
    """Benchmark the implementations of one shape together, one row each.

    Each is compiled and warmed up on the same inputs; then all are timed in `rounds` rounds whose order
    alternates (first to last, then last to first), each round's do_bench measuring `rep_ms / rounds`. A row's
    median and percentiles pool the calls of all its rounds. Interleaving puts every implementation under the
    same drift of the host's and the GPU's state, which one reading of a host-bound shape cannot tell apart
    from the implementations.

    OOMs and other failures become a row's status instead of exceptions, keeping the timings of the rounds
    before; the other implementations go on. `backward_on_caller`: see `_time_round`.
    """
    if len({shape_of(cfg) for cfg in cfgs}) != 1:
        raise ValueError("run_shape takes configs that differ only in their implementation")
    device = resolve_device(cfgs[0].device)
    measured_with = settings(device, warmup_ms, rep_ms, rounds, backward_on_caller)
    rows = [_new_row(cfg, measured_with) for cfg in cfgs]
    samples = [{timing: [] for timing in TIMINGS} for _ in cfgs]
    live: list[tuple[int, AttentionFn]] = []
    inputs: tuple[torch.Tensor, ...] = ()

    def fail(i: int, exc: Exception) -> None:
        _fill_timings(rows[i], cfgs[i], samples[i])
        rows[i].update(failure_fields(exc, rows[i]["message"]))

    try:
        inputs = _inputs(cfgs[0], device)
        for i, cfg in enumerate(cfgs):
            try:
                live.append((i, _prepare(rows[i], cfg, inputs, device)))
            except Exception as exc:  # one implementation must never end the others: record it and go on
                fail(i, exc)
        for r in range(rounds):
            for i, fn in list(live) if r % 2 == 0 else live[::-1]:
                try:
                    _time_round(fn, inputs, samples[i], device, warmup_ms, rep_ms / rounds, backward_on_caller)
                except Exception as exc:
                    fail(i, exc)
                    live.remove((i, fn))
        for i, _ in live:
            _fill_timings(rows[i], cfgs[i], samples[i])
            rows[i]["status"] = "ok"
    except Exception as exc:  # the inputs themselves did not fit: every row fails alike
        for i, row in enumerate(rows):
            if row["status"] is None:
                fail(i, exc)
    finally:
        # Drop the inputs and the implementations before emptying the cache, so that their memory goes back too
        # (the failed frames' tensors are gone once the exceptions are).
        live.clear()
        del inputs
        free_memory()
    return rows


def run_config(cfg: AttentionConfig, warmup_ms: float, rep_ms: float) -> dict:
    """Benchmark one config; OOMs and other failures become the row's status instead of exceptions."""
    return run_shape([cfg], warmup_ms, rep_ms)[0]


def shape_groups(cfgs: list[AttentionConfig], together: bool) -> list[list[AttentionConfig]]:
    """The configs in order, in runs of one shape each when `together` (for `run_shape`), else one by one."""
    if not together:
        return [[cfg] for cfg in cfgs]
    return [list(group) for _, group in itertools.groupby(cfgs, key=shape_of)]


# ---------------------------------------------------------------------------------------------- sweeps


def sweep_configs(impls: Iterable[str], dtypes: Iterable[str], ds: Iterable[int], seqs: Iterable[int],
                  batch: int, heads: int | None, causal: bool, device: str = "auto") -> list[AttentionConfig]:
    """The product dtype × d × seq × impl (implementations side by side for each shape)."""
    impls = list(impls)
    for name in impls:
        check_name(name)
    return [AttentionConfig(impl, dtype, causal, batch, heads, seq, d, device)
            for dtype, d, seq, impl in itertools.product(dtypes, ds, seqs, impls)]

