"""Attention forward and forward+backward replayed from CUDA graphs: what the GPU spends, without host time.

`profiler-kit attention bench` times eager calls, so below N ≈ 8192 it measures each implementation's host
path (docs/results/attention-h100.md, steps 5–7). Here every config's forward, and its forward+backward, is
captured once into a CUDA graph after an eager warm-up (which also autotunes), and do_bench times the graph's
replay: one launch, whatever the implementation does on the host. The graphed gradients are checked against
the eager ones (max error relative to the largest eager gradient). Rows stream to --output (.jsonl, .csv, .md); a
failing config becomes a row with its error and the sweep goes on.

Usage (GPU machine): python3 scripts/attention_graphed.py [--impl flash-triton,sdpa-flash] [--batch 8]
    [--heads H] [--d 16,32,64,128] [--seq 256,1024,4096,8192,16384] [--dtype bf16] [--no-causal] [--output F]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import torch

from profiler_kit.attention.bench import (
    DTYPES,
    KEY_COLUMNS,
    AttentionConfig,
    bench_ms,
    capture_graph,
    failure_fields,
    make_impl,
    sweep_configs,
)
from profiler_kit.render import emit_tables
from profiler_kit.results_io import RowWriter

# What a row holds (a failed config has no timings), in the order of a .csv or .md --output.
COLUMNS = (*KEY_COLUMNS, "device", "status", "fwd_ms", "fwd_p20_ms", "fwd_p80_ms", "fwd_bwd_ms", "fwd_bwd_p20_ms",
           "fwd_bwd_p80_ms", "graph_rel_err", "message")


def measure(cfg: AttentionConfig, warmup_ms: float, rep_ms: float) -> dict:
    """Graph-replay medians of one config's forward and forward+backward, and the graphed gradients' error."""
    device = torch.device("cuda")
    fn = make_impl(cfg.impl, cfg.causal, device)
    generator = torch.Generator(device=device).manual_seed(0)
    q, k, v, grad_out = (torch.randn(cfg.shape, dtype=DTYPES[cfg.dtype], device=device, generator=generator)
                         for _ in range(4))
    leaves = [t.requires_grad_() for t in (q, k, v)]
    fn(*leaves).backward(grad_out)  # compiles and autotunes outside any capture
    eager = [t.grad.clone() for t in leaves]

    def forward_backward() -> None:
        for t in leaves:
            t.grad = None
        fn(*leaves).backward(grad_out)

    both = capture_graph(forward_backward)
    forward = capture_graph(lambda: fn(*leaves))
    both.replay()
    torch.cuda.synchronize()
    error = max(((t.grad.double() - e).abs().max() / e.abs().max()).item() for t, e in zip(leaves, eager, strict=True))
    row = {"graph_rel_err": error}
    for name, graph in (("fwd", forward), ("fwd_bwd", both)):
        timing = bench_ms(graph.replay, device, warmup_ms, rep_ms)
        row.update({f"{name}_ms": timing.median_ms, f"{name}_p20_ms": timing.p20_ms, f"{name}_p80_ms": timing.p80_ms})
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", default="flash-triton,sdpa-flash")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=None)
    parser.add_argument("--d", default="16,32,64,128")
    parser.add_argument("--seq", default="256,1024,4096,8192,16384")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--no-causal", dest="causal", action="store_false")
    parser.add_argument("--warmup", type=float, default=25.0, help="do_bench warm-up, ms")
    parser.add_argument("--rep", type=float, default=100.0, help="do_bench measured time, ms")
    parser.add_argument("--output", help="append one row per config as it finishes (.jsonl, .csv or .md)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: CUDA graphs need a CUDA device", file=sys.stderr)
        return 1

    configs = sweep_configs(args.impl.split(","), args.dtype.split(","), [int(d) for d in args.d.split(",")],
                            [int(n) for n in args.seq.split(",")], args.batch, args.heads, args.causal, "cuda")
    writer = RowWriter(Path(args.output), COLUMNS) if args.output else None
    rows = []
    for cfg in configs:
        row = {**cfg.as_dict(), "device": torch.cuda.get_device_name(), "status": "ok", "message": ""}
        try:
            row.update(measure(cfg, args.warmup, args.rep))
        except Exception as exc:  # one config must not end the sweep
            row.update(failure_fields(exc))
        torch.cuda.empty_cache()
        print(f"{cfg.impl} {cfg.dtype} seq={cfg.seq} d={cfg.d}: {row['status']} {row['message']}", file=sys.stderr)
        if writer:
            writer.append(row)
        rows.append(row)

    results = pd.DataFrame(rows)
    ok = results[results["status"] == "ok"]
    tables = [("graph replays, ms (median)", results[[c for c in ("impl", "dtype", "seq", "d", "status", "fwd_ms",
                                                                   "fwd_bwd_ms", "graph_rel_err", "message")
                                                       if c in results]])]
    if len(ok):
        for timing in ("fwd_ms", "fwd_bwd_ms"):
            pivot = ok.pivot_table(index=["seq", "d"], columns="impl", values=timing).reset_index()
            impls = [name for name in args.impl.split(",") if name in pivot]
            if len(impls) == 2:
                pivot[f"{impls[1]} / {impls[0]}"] = pivot[impls[1]] / pivot[impls[0]]
            tables.append((f"{timing} (graph replay)", pivot))
    emit_tables(tables, "markdown", caption=f"{args.dtype}, batch {args.batch}, heads {args.heads}, "
                f"{'causal' if args.causal else 'non-causal'}; do_bench medians of CUDA graph replays on "
                f"{torch.cuda.get_device_name()}")
    return 0 if len(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
