"""One fwd+bwd of the Triton FlashAttention kernels and of cuDNN SDPA, inside a CUDA profiler range, for
Nsight Compute: where each kernel's cycles go (tensor, MUFU and FMA pipes, issue slots, warp stalls).

The Triton kernels run on pinned configs (the leaderboard shape's winners of step 12), after a warm-up that
compiles them outside the range. Run it under ncu with --profile-from-start off, e.g. (GPU machine):

    ncu --profile-from-start off --section SpeedOfLight --section ComputeWorkloadAnalysis \\
        --section WarpStateStats -o flash python3 scripts/flash_ncu.py
"""

from __future__ import annotations

import argparse
import sys

import torch

from profiler_kit.attention.bench import make_impl
from profiler_kit.attention.flash_triton import JIT_KERNELS
from profiler_kit.attention.flash_triton_bwd import flash_backward
from profiler_kit.attention.flash_triton_fwd import flash_forward
from profiler_kit.attention.flash_triton_launch import configs

# The configs the autotuner picked on the leaderboard shape (B1 H16 N16384 d64 causal) in step 12.
LEADERBOARD_CONFIGS = {
    "fwd": (128, 64, 8, 3, "head_first"), "dkdv": (64, 64, 4, 3, "overlap"), "dq": (128, 64, 4, 3, "head_first"),
}


def pinned(kernel: str):
    return configs([LEADERBOARD_CONFIGS[kernel]], JIT_KERNELS[kernel].arg_names)[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="1,16,16384,64", help="B,H,N,d (causal, bf16)")
    parser.add_argument("--no-cudnn", action="store_true")
    args = parser.parse_args()
    b, h, n, d = (int(x) for x in args.shape.split(","))
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))

    def triton_step() -> None:
        out, lse = flash_forward(q, k, v, True, pinned("fwd"), tma=True)
        pinned_bwd = {kernel: pinned(kernel) for kernel in ("dkdv", "dq")}
        flash_backward(q, k, v, out, lse, do, True, tma=True, configs_by_kernel=pinned_bwd)

    cudnn = make_impl("sdpa-cudnn", True, q.device)

    def cudnn_step() -> None:
        cudnn(*(t.detach().requires_grad_() for t in (q, k, v))).backward(do)

    steps = [("flash-triton", triton_step)]
    if not args.no_cudnn:
        steps.append(("sdpa-cudnn", cudnn_step))
    for _, step in steps:  # compile and warm up outside the profiled range
        step()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for name, step in steps:
        torch.cuda.nvtx.range_push(name)
        step()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"profiled: {', '.join(name for name, _ in steps)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
