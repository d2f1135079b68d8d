"""Step 22: the Gluon forward (`flash_gluon_fwd`) against the Triton forward and cuDNN's SDPA forward.

Per shape: every Gluon config checked against the Triton forward's output first (a wrong config is reported,
not timed), then all implementations timed in ROUNDS interleaved rounds (alternating order, do_bench with the
L2 flushed, `rep_ms` per round), their samples pooled: median [p20, p80] ms and TFLOP/s. Writes one
"BLOCK_N,STAGES,PINGPONG" line per shape (the fastest Gluon config) to --best-dir, for
PROFILER_KIT_FLASH_GLUON_FWD.

    python3 scripts/step22/fwd_bench.py --shapes causal4096,full8192,leaderboard --best-dir $OUT
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from profiler_kit.attention import flash_gluon_fwd, flash_triton_fwd
from profiler_kit.attention.bench import attention_flops, make_impl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from interleaved import SHAPES, pooled_rounds, print_table, run_shapes  # noqa: E402

# (block_n, stages, pingpong) per head dim; 128-key tiles at d = 128 fit 3 stages in 224 KB.
CONFIGS = {
    128: [(128, 3, True), (128, 3, False), (128, 2, True), (128, 2, False), (64, 3, True), (64, 4, True),
          (64, 3, False)],
    64: [(128, 3, True), (128, 2, True), (128, 4, True), (128, 3, False), (64, 4, True), (64, 3, False)],
}


def main() -> None:
    run_shapes(__doc__, measure)


def measure(name: str, rounds: int, rep_ms: float, best_dir: Path | None) -> None:
    """Check, time and print one shape (module docstring)."""
    dev = torch.device("cuda")
    b, h, n, d, causal = SHAPES[name]
    gen = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, dtype=torch.bfloat16, device=dev, generator=gen).requires_grad_()
               for _ in range(3))
    q4, k4, v4 = (t.detach() for t in (q, k, v))
    want_o, want_l = flash_triton_fwd.flash_forward(q4, k4, v4, causal, tma=True)
    impls = {"triton": lambda: flash_triton_fwd.flash_forward(q4, k4, v4, causal, tma=True)}
    cudnn = make_impl("sdpa-cudnn", causal, dev)
    impls["cudnn"] = lambda: cudnn(q, k, v)
    for cfg in CONFIGS[d]:
        label = "gluon {} s{} {}".format(cfg[0], cfg[1], "pp" if cfg[2] else "no-pp")
        try:
            o, lse = flash_gluon_fwd.forward(q4, k4, v4, causal, *cfg)
            torch.cuda.synchronize()
        except Exception as exc:  # a config that does not compile or fit is reported, the rest go on
            print(f"{name} {label}: failed: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        o_err = ((o.float() - want_o.float()).abs().max() / want_o.float().abs().max()).item()
        l_err = (lse - want_l).abs().max().item()
        print(f"{name} {label}: max |O - O_triton| / max|O| = {o_err:.2e}, max |L - L_triton| = {l_err:.2e}")
        if o_err > 2e-2 or l_err > 1e-2:
            print(f"{name} {label}: WRONG, not timed")
            continue
        impls[label] = (lambda c: lambda: flash_gluon_fwd.forward(q4, k4, v4, causal, *c))(cfg)
    samples = pooled_rounds(impls, dev, rounds, rep_ms)
    print(f"\n{name} (B{b} H{h} N{n} d{d} {'causal' if causal else 'non-causal'}), {rounds} rounds")
    best = print_table("forward", samples, attention_flops(b * h, n, d, causal, "fwd"), prefix="gluon")
    if best and best_dir:
        block_n, stages, pp = best.split()[1:]
        (best_dir / f"best-{name}.txt").write_text(f"{block_n},{stages.lstrip('s')},{int(pp == 'pp')}\n")
    print(flush=True)


if __name__ == "__main__":
    main()
