"""Step 23: the two-warp-group fused backward (`flash_gluon_fused`) against the split Triton backward and cuDNN's.

Per shape: the forward's O and L from `flash_forward` (its defaults); the split backward's dQ, dK, dV as the check;
every offered fused config (`flash_gluon_fused.CONFIGS`) checked against them first (a wrong config is reported,
not timed); then the whole backward of each (D pre-pass, kernels, dQ's cast) and cuDNN's SDPA backward timed in
ROUNDS interleaved rounds (alternating order, do_bench with the L2 flushed, `rep_ms` per round), their samples
pooled: median [p20, p80] ms and TFLOP/s (2.5 forward's FLOPs). Writes the fastest fused config per shape as a
"STAGES,DEFER" line to --best-dir/bwd-best-<shape>.txt, for PROFILER_KIT_FLASH_GLUON_BWD.

    python3 scripts/step23/bwd_bench.py --shapes causal4096,full8192,leaderboard --best-dir $OUT
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from profiler_kit.attention import flash_gluon_fused, flash_triton_bwd, flash_triton_fwd
from profiler_kit.attention.bench import Timing, attention_flops, sample_ms

SHAPES = {
    "causal4096": (4, 16, 4096, 128, True),
    "full8192": (4, 16, 8192, 128, False),
    "leaderboard": (1, 16, 16384, 64, True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rep-ms", type=float, default=100.0)
    parser.add_argument("--best-dir", type=Path, default=None)
    args = parser.parse_args()
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for name in args.shapes.split(","):
        measure(name, args.rounds, args.rep_ms, args.best_dir)


def _backward(setting: str, q4, k4, v4, out, lse, do, causal):
    """The whole backward with PROFILER_KIT_FLASH_GLUON_BWD set to `setting` ("0": the split kernels)."""
    os.environ[flash_gluon_fused.BWD_ENV] = setting
    return flash_triton_bwd.flash_backward(q4, k4, v4, out, lse, do, causal)


def measure(name: str, rounds: int, rep_ms: float, best_dir: Path | None) -> None:
    """Check, time and print one shape (module docstring)."""
    dev = torch.device("cuda")
    b, h, n, d, causal = SHAPES[name]
    gen = torch.Generator(device=dev).manual_seed(0)
    q, k, v, do = (torch.randn(b, h, n, d, dtype=torch.bfloat16, device=dev, generator=gen) for _ in range(4))
    out, lse = flash_triton_fwd.flash_forward(q, k, v, causal)
    want = _backward("0", q, k, v, out, lse, do, causal)
    impls = {"split": lambda: _backward("0", q, k, v, out, lse, do, causal)}
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
        o_ref = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
    impls["cudnn"] = lambda: torch.autograd.grad(o_ref, (qg, kg, vg), do, retain_graph=True)
    for cfg in flash_gluon_fused.CONFIGS[d]:
        setting = f"{cfg['stages']},{int(cfg['defer'])}"
        label = f"fused s{cfg['stages']}" + (" defer" if cfg["defer"] else "")
        try:
            got = _backward(setting, q, k, v, out, lse, do, causal)
            torch.cuda.synchronize()
        except Exception as exc:  # a config that does not compile or fit is reported, the rest go on
            print(f"{name} {label}: failed: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        errs = {g: ((x.float() - w.float()).abs().max() / w.float().abs().max()).item()
                for g, x, w in zip(("dq", "dk", "dv"), got, want, strict=True)}
        print(f"{name} {label}: max |x - x_split| / max |x_split|: "
              + ", ".join(f"{g} {e:.2e}" for g, e in errs.items()))
        if max(errs.values()) > 2e-2:
            print(f"{name} {label}: WRONG, not timed")
            continue
        impls[label] = (lambda s: lambda: _backward(s, q, k, v, out, lse, do, causal))(setting)
    samples: dict[str, list[float]] = {label: [] for label in impls}
    order = list(impls)
    for r in range(rounds):
        for label in (order if r % 2 == 0 else order[::-1]):
            samples[label] += sample_ms(impls[label], dev, 25.0, rep_ms)
    os.environ[flash_gluon_fused.BWD_ENV] = "0"
    flops = attention_flops(b * h, n, d, causal, "bwd")
    print(f"\n{name} (B{b} H{h} N{n} d{d} {'causal' if causal else 'non-causal'}), backward, {rounds} rounds")
    print("| backward | median ms [p20, p80] | TFLOP/s | cuDNN ms / ms |")
    print("|---|---|---:|---:|")
    cudnn_ms = Timing.of(samples["cudnn"]).median_ms
    for label, times in sorted(samples.items(), key=lambda kv: Timing.of(kv[1]).median_ms):
        t = Timing.of(times)
        print(f"| {label} | {t.median_ms:.3f} [{t.p20_ms:.3f}, {t.p80_ms:.3f}] | {flops / t.median_ms / 1e9:.1f} "
              f"| {cudnn_ms / t.median_ms:.3f} |")
    fused = [label for label in samples if label.startswith("fused")]
    if fused and best_dir:
        best = min(fused, key=lambda label: Timing.of(samples[label]).median_ms)
        (best_dir / f"bwd-best-{name}.txt").write_text(f"{best.split()[1].lstrip('s')},{int('defer' in best)}\n")
    print(flush=True)


if __name__ == "__main__":
    main()
