"""A plain compiled training script: the anchor that the benchmark's train rows are read against.

The built-in model (`profiler_kit.model.TransformerLM`) trained the way a user would write it, with nothing of
profiler-kit's harness: fp32 weights, `torch.compile(model)` of the whole model, torch's fused AdamW, bf16
autocast, SDPA attention, and the loop timed on the host clock (one synchronize before and one after the timed
steps; the mean step time is their span over the step count). One JSON row per model goes to stdout, and to
`--output` (JSON lines) when given.

    PYTHONPATH=$PWD python3 tools/plain_step.py --model xl,2.7B --ctx 512 --batch-size 4 [--output rows.jsonl]
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path

import torch

from profiler_kit.flops import mfu_pct, step_flops
from profiler_kit.model import TransformerLM
from profiler_kit.presets import count_parameters, from_name

MIB = 2**20


def measure(model_name: str, ctx: int, batch_size: int, warmup: int, steps: int, mode: str | None) -> dict:
    """One model's row: the mean step time over `steps` steps after `warmup` untimed ones."""
    cfg = from_name(model_name, ctx)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = TransformerLM(cfg, attention="sdpa")
    compiled = torch.compile(model, mode=mode)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
    data = torch.randint(0, cfg.vocab_size, (batch_size, ctx + 1), device="cuda")
    inputs, targets = data[:, :-1], data[:, 1:]

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = compiled(inputs, targets)
        loss.backward()
        optimizer.step()

    torch.cuda.reset_peak_memory_stats()
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / steps
    tflops = step_flops(cfg, batch_size, ctx, "train") / seconds / 1e12
    device = torch.cuda.get_device_name()
    return {"script": "plain", "model": model_name, "ctx": ctx, "batch_size": batch_size, "attention": "sdpa",
            "optimizer": "adamw-fused", "compile_mode": mode or "default", "warmup": warmup, "steps": steps,
            "device": device, "total_ms": seconds * 1e3, "tokens_per_s": batch_size * ctx / seconds,
            "model_tflops": tflops, "mfu_pct": mfu_pct(tflops, device, True), "params": count_parameters(cfg),
            "peak_allocated_mib": torch.cuda.max_memory_allocated() / MIB}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="2.7B", help="comma-separated presets (default: %(default)s)")
    parser.add_argument("--ctx", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps, compilation included")
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--mode", default=None, help="torch.compile's mode (default: its default)")
    parser.add_argument("--output", type=Path, help="append the rows to this JSON-lines file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("Error: the plain script needs a CUDA device")
    for name in args.model.split(","):
        row = measure(name, args.ctx, args.batch_size, args.warmup, args.steps, args.mode)
        line = json.dumps(row)
        print(line, flush=True)
        if args.output:
            with args.output.open("a") as out:
                out.write(line + "\n")
        torch._dynamo.reset()  # the next model compiles afresh, on memory this one no longer holds
        gc.collect()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
