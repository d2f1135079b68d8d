"""Host time of the Triton attention calls, layer by layer, with direct launches on and off.

On a shape whose kernels take a few µs, back-to-back calls are limited by the host: the wall time of `--calls`
calls (then one synchronize) divided by their number is the host cost of one call. Printed per layer (the
forward launcher, the backward launchers, the autograd Function's forward, backward and forward+backward) and,
for reference, for SDPA's FlashAttention-2 backend and a Python autograd Function that only clones: the
median over `--repeats` rounds with the min and max, in µs.
`--profile` adds cProfile's top functions of the autograd forward+backward with direct launches on. With
PROFILER_KIT_FLASH_CPP=1 three more rows time the C++ host path (`flash_cpp`), which takes over once the
first call has registered the layout.

Usage (GPU machine): python3 scripts/flash_host_time.py [--batch 8 --seq 256 --d 64 --calls 200 --profile]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from profiler_kit.attention import FlashAttentionTriton, flash_cpp
from profiler_kit.attention.flash_triton import triton_attention
from profiler_kit.attention.flash_triton_bwd import flash_backward
from profiler_kit.attention.flash_triton_fwd import flash_forward
from profiler_kit.attention.flash_triton_launch import DIRECT_ENV


class _OneClone(torch.autograd.Function):
    """The least a Python autograd Function over q, k, v can cost: one clone forward, gradients passed through."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return q.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, grad, grad


def host_us(fn: Callable[[], object], calls: int, repeats: int) -> tuple[float, float, float]:
    """(median, min, max) over `repeats` rounds of the mean host time of one of `calls` back-to-back calls."""
    fn()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        rounds.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(rounds), min(rounds), max(rounds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=1)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)

    shape = (args.batch, args.heads, args.seq, args.d)
    q, k, v, grad_out = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = flash_forward(q, k, v, True)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]

    def fwd_bwd(forward: Callable[[], torch.Tensor]) -> Callable[[], None]:
        """One forward and its backward, gradients cleared after."""
        def run() -> None:
            forward().backward(grad_out)
            for t in leaves:
                t.grad = None

        return run

    def sdpa_fwd() -> torch.Tensor:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(*leaves, is_causal=True)

    autograd_fwd_bwd = fwd_bwd(lambda: FlashAttentionTriton.apply(*leaves, True))

    def backward_again(output: torch.Tensor) -> Callable[[], None]:
        def run() -> None:
            output.backward(grad_out, retain_graph=True)
            for t in leaves:
                t.grad = None

        return run

    def cpp_backward_again() -> Callable[[], None]:
        """Like `backward_again`, on a graph made at the first call (the layout is registered by then)."""
        graph: list[Callable[[], None]] = []

        def run() -> None:
            if not graph:
                graph.append(backward_again(triton_attention(*leaves, True)))
            graph[0]()

        return run

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        sdpa_out = F.scaled_dot_product_attention(*leaves, is_causal=True)
    # name: (function, whether it goes through the Triton launchers)
    layers = {
        "flash_forward (launcher)": (lambda: flash_forward(q, k, v, True), True),
        "flash_backward (launchers)": (lambda: flash_backward(q, k, v, out, lse, grad_out, True), True),
        "autograd forward": (lambda: FlashAttentionTriton.apply(*leaves, True), True),
        "autograd backward (replayed)": (backward_again(FlashAttentionTriton.apply(*leaves, True)), True),
        "autograd forward+backward": (autograd_fwd_bwd, True),
        "sdpa-flash forward": (sdpa_fwd, False),
        "sdpa-flash backward (replayed)": (backward_again(sdpa_out), False),
        "sdpa-flash forward+backward": (fwd_bwd(sdpa_fwd), False),
        "Function floor (one clone)": (fwd_bwd(lambda: _OneClone.apply(*leaves)), False),
    }
    if flash_cpp.ENABLED:  # the first call (host_us's warm-up) registers the layout; the rest run in C++
        layers["C++ path forward+backward"] = (fwd_bwd(lambda: triton_attention(*leaves, True)), False)
        layers["C++ path forward"] = (lambda: triton_attention(*leaves, True), False)
        layers["C++ path backward (replayed)"] = (cpp_backward_again(), False)
    columns = ("direct off", "direct on", "on, backward here")
    print(f"host µs per call, bf16 causal, shape {shape}, {args.calls} calls × {args.repeats} rounds "
          f"({torch.cuda.get_device_name()}, torch {torch.__version__}); the last column runs the autograd "
          "engine on the calling thread instead of its CUDA device thread")
    print(f"{'layer':<30}" + "".join(f"{c:>24}" for c in columns))
    for name, (fn, launches) in layers.items():
        cells = []
        for column in columns:
            if column == "direct off" and not launches:
                cells.append("")
                continue
            os.environ[DIRECT_ENV] = "0" if column == "direct off" else "1"
            with torch.autograd.set_multithreading_enabled(column != "on, backward here"):
                median, low, high = host_us(fn, args.calls, args.repeats)
            cells.append(f"{median:.1f} [{low:.1f}, {high:.1f}]")
        print(f"{name:<30}" + "".join(f"{c:>24}" for c in cells))
    if flash_cpp.ENABLED:
        print(f"C++ path registered for this layout: {flash_cpp.has_plan(*leaves, True)}")

    if args.profile:
        os.environ[DIRECT_ENV] = "1"
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(args.calls):
            autograd_fwd_bwd()
        torch.cuda.synchronize()
        profile.disable()
        pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
