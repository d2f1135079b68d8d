"""The built-in workload as a program: `python -m profiler_kit.recording.targets --spec JSON`, which
`builtin` runs under a recorder like any other program.

A target is a training-step workload or a set of attention implementations. The program marks its steps as
any user program would, with `profiler_kit.capture(warmup, steps)` made before its first CUDA call, so only
the steps after the warm-up are recorded (torch.profiler, the `cudaProfilerApi` range of nsys on a GPU, or the
memory history), and describes itself to the recording (`api.describe`: its config, steps and the Linear
weights' sizes, which the memory analysis compares with what it finds). Failures end it with one line
`error: ...` on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from profiler_kit import distributed
from profiler_kit.device import resolve_device
from profiler_kit.errors import ProfilerKitError, first_line
from profiler_kit.nvtx_ranges import nvtx_range
from profiler_kit.recording.api import capture, describe
from profiler_kit.workload import Workload, WorkloadConfig

EXIT_ERROR = 2


@dataclass
class Target:
    """One thing to profile: `step()` runs one step of it on `device`; `meta` describes it to the recording."""

    device: torch.device
    step: Callable[[], object]
    meta: dict = field(default_factory=dict)


def workload_target(cfg: WorkloadConfig) -> Target:
    workload = Workload(cfg)
    linear = [m.weight.numel() for m in workload.model.modules() if isinstance(m, torch.nn.Linear)]
    return Target(workload.device, workload.step, {"config": cfg.as_dict(), "linear_weight_numels": linear})


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


def build_target(spec: dict, note: Callable[[str], None]) -> Target:
    """The target a spec names: `{"workload": {WorkloadConfig fields}}` or `{"attention": {...}}`."""
    if "workload" in spec:
        return workload_target(WorkloadConfig(**spec["workload"]))
    return attention_target(**spec["attention"], note=note)


def _note(message: str) -> None:
    print(f"profiler-kit: {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the built-in workload (started by `profiler-kit nsys`).")
    parser.add_argument("--spec", required=True, help="JSON: the target, warmup, steps")
    spec = json.loads(parser.parse_args(argv).spec)
    try:
        cap = capture(warmup=spec["warmup"], steps=spec["steps"])  # before the first CUDA call
        target = build_target(spec, _note)
        describe(**target.meta, steps=spec["steps"], warmup=spec["warmup"])
        with cap:
            for _ in range(spec["warmup"] + spec["steps"]):
                with cap.step():
                    target.step()
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
