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

import os
import sys
from pathlib import Path

import torch

from profiler_kit.attention import flash_gluon_fused, flash_triton_bwd, flash_triton_fwd
from profiler_kit.attention.bench import attention_flops

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flash_gluon_dkdv import cudnn_backward, max_rel_diff  # noqa: E402
from interleaved import SHAPES, pooled_rounds, print_table, run_shapes  # noqa: E402


def main() -> None:
    run_shapes(__doc__, measure)


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
    impls["cudnn"] = cudnn_backward(q, k, v, do, causal)
    settings = {}
    for cfg in flash_gluon_fused.CONFIGS[d]:
        setting = flash_gluon_fused.setting(cfg)
        label = f"fused s{cfg['stages']} m{cfg['block_m']}" + (" defer" if cfg["defer"] else "")
        settings[label] = setting
        try:
            got = _backward(setting, q, k, v, out, lse, do, causal)
            torch.cuda.synchronize()
        except Exception as exc:  # a config that does not compile or fit is reported, the rest go on
            print(f"{name} {label}: failed: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        errs = {g: max_rel_diff([x], [w]) for g, x, w in zip(("dq", "dk", "dv"), got, want, strict=True)}
        print(f"{name} {label}: max |x - x_split| / max |x_split|: "
              + ", ".join(f"{g} {e:.2e}" for g, e in errs.items()))
        if max(errs.values()) > 2e-2:
            print(f"{name} {label}: WRONG, not timed")
            continue
        impls[label] = (lambda s: lambda: _backward(s, q, k, v, out, lse, do, causal))(setting)
    samples = pooled_rounds(impls, dev, rounds, rep_ms)
    os.environ[flash_gluon_fused.BWD_ENV] = "0"
    print(f"\n{name} (B{b} H{h} N{n} d{d} {'causal' if causal else 'non-causal'}), backward, {rounds} rounds")
    best = print_table("backward", samples, attention_flops(b * h, n, d, causal, "bwd"), prefix="fused")
    if best and best_dir:
        (best_dir / f"bwd-best-{name}.txt").write_text(settings[best] + "\n")
    print(flush=True)


if __name__ == "__main__":
    main()
