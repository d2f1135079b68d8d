"""Check FlashAttentionTriton on a CUDA GPU: errors against an fp32 reference and speed against SDPA.

    python scripts/attention_gpu_check.py            # leaderboard: B1 H16 N16384 d64 causal bf16
    python scripts/attention_gpu_check.py --extra    # also issue 6's d128 configs

For each config it prints, per implementation (flash-triton, SDPA's cuDNN and FlashAttention-2 backends), the
largest error of o, dq, dk, dv relative to the largest reference magnitude (the reference is SDPA's
memory-efficient backend on fp32 copies of the inputs), then forward and forward+backward
`triton.testing.do_bench` medians with TFLOP/s and ratios to the SDPA backends, and finally the configs the
autotuner chose. The first call per head dim compiles and times every autotune config (tens of seconds).
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from profiler_kit.attention import FlashAttentionTriton, tuned_configs

LEADERBOARD = {"batch": 1, "heads": 16, "seq": 16384, "d": 64, "causal": True}
# Issue 6's d128 configs (batch 4, 16 heads).
EXTRA = [
    {"batch": 4, "heads": 16, "seq": 4096, "d": 128, "causal": True},
    {"batch": 4, "heads": 16, "seq": 8192, "d": 128, "causal": False},
]
SDPA = {"sdpa-cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa-flash": SDPBackend.FLASH_ATTENTION}
# FlashAttention-2 paper counting: the backward does 2.5× the forward's matmul work.
BACKWARD_FLOP_RATIO = 2.5


def _impls(causal: bool) -> dict:
    def sdpa(backend: SDPBackend):
        def run(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        return run

    impls = {"flash-triton": lambda q, k, v: FlashAttentionTriton.apply(q, k, v, causal)}
    impls.update({name: sdpa(backend) for name, backend in SDPA.items()})
    return impls


def _grads(fn, q, k, v, grad_out):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    out.backward(grad_out)
    return {"o": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def _time(fn, q, k, v, grad_out) -> tuple[float, float]:
    """do_bench medians in ms of the forward and of forward+backward."""
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    fwd = triton.testing.do_bench(lambda: fn(q, k, v), return_mode="median")
    fwd_bwd = triton.testing.do_bench(
        lambda: fn(qg, kg, vg).backward(grad_out), grad_to_none=[qg, kg, vg], return_mode="median"
    )
    return fwd, fwd_bwd


def _check(cfg: dict, dtype: torch.dtype) -> None:
    b, h, n, d, causal = cfg["batch"], cfg["heads"], cfg["seq"], cfg["d"], cfg["causal"]
    print(f"\n== B{b} H{h} N{n} d{d} {'causal' if causal else 'non-causal'} {str(dtype)[6:]} ==")
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, grad_out = (torch.randn(b, h, n, d, device="cuda", dtype=dtype, generator=gen) for _ in range(4))
    impls = _impls(causal)

    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        ref = _grads(
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
            *(t.float() for t in (q, k, v, grad_out)),
        )
    print(f"{'impl':<14}" + "".join(f"{'err ' + name:>12}" for name in ref))
    for name, fn in impls.items():
        try:
            got = _grads(fn, q, k, v, grad_out)
        except RuntimeError as exc:  # an SDPA backend that does not support this config
            print(f"{name:<14} unavailable: {str(exc).splitlines()[0]}")
            continue
        errs = [((got[t].float() - ref[t]).abs().max() / ref[t].abs().max()).item() for t in ref]
        print(f"{name:<14}" + "".join(f"{e:>12.2e}" for e in errs))
    del ref

    fwd_flop = 4 * b * h * n * n * d / (2 if causal else 1)
    flop = (fwd_flop, fwd_flop * (1 + BACKWARD_FLOP_RATIO))
    times = {}
    for name, fn in impls.items():
        try:
            times[name] = _time(fn, q, k, v, grad_out)
        except RuntimeError:
            continue
    print(f"{'impl':<14}{'fwd ms':>9}{'TFLOP/s':>9}{'fwd+bwd ms':>12}{'TFLOP/s':>9}"
          + "".join(f"{'vs ' + s:>16}" for s in SDPA))
    for name, (fwd, fwd_bwd) in times.items():
        ratios = "".join(
            f"{times[s][0] / fwd:>8.2f}/{times[s][1] / fwd_bwd:<7.2f}" if s in times else f"{'-':>16}"
            for s in SDPA
        )
        tflops = (flop[0] / fwd / 1e9, flop[1] / fwd_bwd / 1e9)
        print(f"{name:<14}{fwd:>9.3f}{tflops[0]:>9.0f}{fwd_bwd:>12.3f}{tflops[1]:>9.0f}{ratios}")
    print("(vs X: X's time / this time, forward/forward+backward; > 1 means faster than X)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extra", action="store_true", help="also run issue 6's d128 configs")
    parser.add_argument("--fp32", action="store_true", help="also check fp32 (TF32 matmuls) at each config")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 1
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | triton {triton.__version__}")
    dtypes = [torch.bfloat16] + ([torch.float32] if args.fp32 else [])
    for cfg in [LEADERBOARD] + (EXTRA if args.extra else []):
        for dtype in dtypes:
            _check(cfg, dtype)
    print("\nautotuned configs (key: HEAD_DIM, CAUSAL, SEQ_BUCKET, tensor dtypes):")
    for kernel, chosen in tuned_configs().items():
        for key, config in chosen.items():
            print(f"  {kernel} {key}: {config}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
