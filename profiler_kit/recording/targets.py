"""What gets profiled, and the child process that runs it under nsys.

A target is a training-step workload or a set of attention implementations; `drive` runs its warm-up steps
(in an NVTX range `warmup`), then its profiled steps inside a recording context: the `cudaProfilerApi` capture
range under nsys, torch.profiler for the torch backend. nsys runs this module as `python -m
profiler_kit.recording.targets --spec JSON`; failures end it with one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from profiler_kit import distributed
from profiler_kit.recording import ranges as nvtx_ranges
from profiler_kit.errors import ProfilerKitError, first_line
from profiler_kit.recording.ranges import nvtx_range
from profiler_kit.workload import Workload, WorkloadConfig, resolve_device, synchronize

# Lines the child prints with this prefix are shown to the user by the parent (which captures nsys's output).
NOTE_PREFIX = "profiler-kit note: "
CAPTURES = ("cudaProfilerApi", "none")
EXIT_ERROR = 2


@dataclass
class Target:
    """One thing to profile: `step()` runs one step of it on `device`."""

    device: torch.device
    step: Callable[[], object]


def workload_target(cfg: WorkloadConfig) -> Target:
    workload = Workload(cfg)
    return Target(workload.device, workload.step)


def attention_target(impls: list[str], dtype: str, causal: bool, batch: int, heads: int | None, seq: int,
                     d: int, device: str, note: Callable[[str], None]) -> Target:
    """Each implementation's forward and backward on its own inputs, in NVTX ranges `<impl>` holding
    `<impl>.forward` and `<impl>.backward`. An implementation that cannot run this config (checked by running
    it once, as warm-up) is left out with a note; none left is an error."""
    from profiler_kit.attention.registry import DTYPES, input_shape, make_impl

    dev = resolve_device(device)
    generator = torch.Generator(device=dev).manual_seed(0)
    runs: list[Callable[[], None]] = []
    for impl in impls:
        shape = input_shape(batch, heads, seq, d)
        q, k, v, grad_out = (torch.randn(shape, dtype=DTYPES[dtype], device=dev, generator=generator)
                             for _ in range(4))
        for t in (q, k, v):
            t.requires_grad_(True)
        try:
            fn = make_impl(impl, causal, dev)
        except Exception as exc:  # e.g. Triton without a GPU: leave it out, as the benchmark does
            note(f"skipping {impl}: {first_line(exc)}")
            continue

        def run(impl=impl, fn=fn, q=q, k=k, v=v, grad_out=grad_out) -> None:
            with nvtx_range(impl):
                with nvtx_range(f"{impl}.forward"):
                    out = fn(q, k, v)
                with nvtx_range(f"{impl}.backward"):
                    out.backward(grad_out)
            for t in (q, k, v):
                t.grad = None

        try:
            with nvtx_range("warmup"):
                run()  # compiles and autotunes, and finds configs the implementation cannot run
        except Exception as exc:
            note(f"skipping {impl}: {first_line(exc)}")
            continue
        runs.append(run)
    if not runs:
        raise ProfilerKitError(f"none of {', '.join(impls)} runs {dtype} attention on {dev.type} here")

    def step() -> None:
        for run in runs:
            run()

    return Target(dev, step)


def drive(target: Target, warmup: int, steps: int, recording: contextlib.AbstractContextManager) -> None:
    """Warm-up steps outside `recording`, then `steps` steps inside it, each group ended by a device sync."""
    with nvtx_range("warmup"):
        for _ in range(warmup):
            target.step()
    synchronize(target.device)
    with recording:
        for _ in range(steps):
            target.step()
        synchronize(target.device)


@contextlib.contextmanager
def cuda_profiler_range() -> Iterator[None]:
    """cudaProfilerStart/Stop: the capture range of `nsys profile --capture-range=cudaProfilerApi`."""
    torch.cuda.profiler.start()
    try:
        yield
    finally:
        torch.cuda.profiler.stop()


def nvtx_reaches_tool() -> bool:
    """False when a tool such as nsys is attached (NVTX_INJECTION64_PATH) but the `nvtx` package records
    nothing: recent nvtx releases ask the tool `nvtxDomainIsEnabled`, which older nsys (Debian's 2022.4) do
    not answer, and then drop every range."""
    if nvtx_ranges.BACKEND != "nvtx" or not os.environ.get("NVTX_INJECTION64_PATH"):
        return True
    import nvtx

    return type(nvtx.get_domain()).__name__ != "DummyDomain"


def build_target(spec: dict, note: Callable[[str], None]) -> Target:
    """The target a spec names: `{"workload": {WorkloadConfig fields}}` or `{"attention": {...}}`."""
    if "workload" in spec:
        return workload_target(WorkloadConfig(**spec["workload"]))
    return attention_target(**spec["attention"], note=note)


def _note(message: str) -> None:
    print(NOTE_PREFIX + message, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run one profiling target (started by `profiler-kit nsys`).")
    parser.add_argument("--spec", required=True, help="JSON: target, warmup, steps, capture")
    spec = json.loads(parser.parse_args(argv).spec)
    try:
        target = build_target(spec, _note)
        if nvtx_ranges.is_enabled() and not nvtx_reaches_tool():
            _note("this nsys ignores the nvtx package's ranges (it does not answer nvtxDomainIsEnabled): "
                  "the report will have no NVTX ranges, hence no phases; a newer nsys records them")
        capture = spec["capture"]
        if capture not in CAPTURES:
            raise ProfilerKitError(f"unknown capture {capture!r}; expected one of {', '.join(CAPTURES)}")
        recording = cuda_profiler_range() if capture == "cudaProfilerApi" else contextlib.nullcontext()
        drive(target, spec["warmup"], spec["steps"], recording)
        distributed.leave()
    except ProfilerKitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except torch.cuda.OutOfMemoryError as exc:
        print(f"error: {first_line(exc)}", file=sys.stderr)
        return EXIT_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
