"""Time every candidate config of the Triton FlashAttention-2 kernels, one by one, on three tuning shapes (GPU)."""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import json
import multiprocessing
import sys
import time

import torch
import triton

from profiler_kit.attention.triton_kernels.bwd import KERNELS as TUNED
from profiler_kit.attention.triton_kernels.bwd import flash_backward
from profiler_kit.attention.triton_kernels.configs import CONFIG_FLAGS, configs
from profiler_kit.attention.triton_kernels.fwd import flash_forward

KERNELS = {name: kernel.fn for name, kernel in TUNED.items()}
SHIPPED_SHAPES = {name: kernel.shapes for name, kernel in TUNED.items()}
EPILOG = """The autotuner only keeps its winner; this sweep prints the whole table (median ms per config, with pointer
and with TMA loads). Every candidate is compiled first in a pool of worker processes (Triton's on-disk cache
then serves the timing process). Each result is checked against the pointer version with the partner configs
on the same inputs. A backward row times both kernels (and the D pre-pass): the kernel named runs the config of
the row, the other its fixed partner. --orders both: every config on both grid orders; --overlap both, --regs
both: every config with and without that flag (see `configs.configs`); --candidates shipped: the kernels' own
config lists, flags included."""

# name: (Z, H, N, d, causal); bf16 throughout.
SHAPES = {
    "leaderboard": (1, 16, 16384, 64, True),
    "causal4096": (4, 16, 4096, 128, True),
    "full8192": (4, 16, 8192, 128, False),
}
# (BLOCK_M, BLOCK_N, warps, stages, *flags) as in `configs.configs`; the warp-specialised ("ws")
# variants run with TMA loads only.
FWD_CANDIDATES = [
    (128, 64, 8, 3), (128, 64, 4, 3), (128, 64, 4, 4), (128, 64, 8, 2), (128, 64, 8, 4), (128, 128, 8, 2),
    (128, 128, 8, 3), (128, 32, 4, 4), (64, 64, 4, 3), (64, 64, 4, 4), (64, 32, 4, 4), (128, 64, 4, 2),
    (64, 64, 4, 2),
    # 128-key tiles under one warp group, and 128 query rows per warp group (256 over 8 warps).
    (64, 128, 4, 2), (64, 128, 4, 3), (128, 128, 8, 4), (256, 64, 8, 2), (256, 64, 8, 3), (256, 128, 8, 2),
]
DKDV_CANDIDATES = [
    (32, 128, 4, 3), (32, 128, 8, 3), (32, 128, 8, 4), (64, 128, 8, 2), (64, 128, 8, 3), (64, 128, 8, 4),
    (128, 128, 8, 2), (32, 64, 4, 3), (64, 64, 4, 3), (64, 64, 4, 4), (64, 64, 4, 2),
    # Query tiles wider than the key tile: one masked diagonal tile per key tile.
    (128, 64, 4, 3), (128, 64, 4, 2),
    # 168 registers let three 4-warp blocks share an SM (65536 / (168 · 128) ≥ 3), if shared memory allows.
    (64, 64, 4, 2, "maxnreg=168"), (64, 64, 4, 3, "maxnreg=168"),
]
DQ_CANDIDATES = [
    (128, 32, 4, 3), (128, 32, 8, 3), (128, 32, 8, 4), (128, 64, 4, 3), (128, 64, 4, 4), (128, 64, 8, 2),
    (128, 64, 8, 3), (128, 64, 8, 4), (64, 32, 4, 3), (64, 64, 4, 3), (64, 64, 4, 2), (128, 32, 8, 2),
    (128, 64, 4, 2), (64, 32, 4, 2),
    # Wider key tiles, and 128 query rows per warp group.
    (128, 128, 8, 2), (128, 128, 8, 3), (256, 64, 8, 2), (256, 32, 8, 3),
]
WS_CANDIDATES = {
    "fwd": [(128, 64, 8, 3, "ws"), (128, 128, 8, 3, "ws"), (128, 64, 8, 2, "ws"), (128, 128, 8, 2, "ws")],
    "dkdv": [(64, 128, 8, 3, "ws"), (64, 128, 8, 2, "ws"), (64, 64, 4, 3, "ws"), (32, 128, 8, 3, "ws")],
    "dq": [(128, 64, 8, 3, "ws"), (128, 64, 8, 4, "ws"), (128, 64, 4, 3, "ws"), (128, 32, 8, 3, "ws")],
}
# The backward's fixed partner while the other kernel is swept, per head dim (the best of an earlier sweep).
PARTNERS = {64: {"dkdv": (64, 64, 4, 3), "dq": (128, 64, 4, 3)}, 128: {"dkdv": (64, 128, 8, 3), "dq": (128, 64, 8, 3)}}


def config(shape: tuple, kernel: str) -> triton.Config:
    return configs([shape], KERNELS[kernel].arg_names)[0]


def inputs(name: str, seed: int = 0):
    z, h, n, d, causal = SHAPES[name]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(z, h, n, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
    out, lse, _ = flash_forward(q, k, v, causal, config(FWD_CANDIDATES[0], "fwd"), tma=False)
    return q, k, v, do, out, lse, causal


def with_flags(shape: tuple, flags: list[str]) -> tuple:
    """The same config with `flags` added (a flag the config already names is not named twice)."""
    return (*shape, *(f for f in flags if f not in shape))


def flag_sets(kernel: str, orders: tuple[bool, ...], toggles: dict[str, tuple[bool, ...]]) -> list[list[str]]:
    """Every combination of extra flags a config runs with: "head_first" per `orders`, and each flag of
    `toggles` (e.g. {"overlap": (False, True)}) per its choices, for the kernels that declare its constexpr."""
    sets = [["head_first"] if order else [] for order in orders]
    for flag, choices in toggles.items():
        if CONFIG_FLAGS[flag] in KERNELS[kernel].arg_names:
            sets = [[*s, *([flag] if on else [])] for s in sets for on in choices]
    return sets


def jobs(loads: tuple[bool, ...], orders: tuple[bool, ...] = (False,),
         toggles: dict[str, tuple[bool, ...]] | None = None, shipped: bool = False) -> list[tuple]:
    """Every (shape, kernel, TMA loads, config, partner config) to compile and time; with True in `orders`
    each config also on a head-first grid, and each config with the flag sets of `flag_sets`. `shipped` takes
    the kernels' own lists."""
    todo = []
    for name in SHAPES:
        partners = PARTNERS[SHAPES[name][3]]
        if shipped:
            candidates = SHIPPED_SHAPES
        else:
            candidates = {kernel: [*shapes, *(WS_CANDIDATES[kernel] if True in loads else [])] for kernel, shapes
                          in {"fwd": FWD_CANDIDATES, "dkdv": DKDV_CANDIDATES, "dq": DQ_CANDIDATES}.items()}
        for kernel, shapes in candidates.items():
            partner = {"fwd": None, "dkdv": partners["dq"], "dq": partners["dkdv"]}[kernel]
            for c in shapes:
                for flags in flag_sets(kernel, orders, toggles or {}):
                    todo += [(name, kernel, tma, with_flags(c, flags), partner) for tma in loads
                             if tma or "ws" not in c]  # warp-specialised configs run with TMA loads only
    return todo


def call(job, tensors):
    """The function a job times: one forward or one whole backward with the job's configs pinned."""
    name, kernel, tma, shape, partner = job
    q, k, v, do, out, lse, causal = tensors
    if kernel == "fwd":
        return lambda: flash_forward(q, k, v, causal, config(shape, kernel), tma=tma)[:2]
    other = "dq" if kernel == "dkdv" else "dkdv"
    pinned = {kernel: config(shape, kernel), other: config(partner, other)}
    return lambda: flash_backward(q, k, v, out, lse, do, causal, tma=tma, configs_by_kernel=pinned)[:3]


def warm(batch: list[tuple]) -> list[str | None]:
    """Worker: compile (by running once) each job of a batch; the error text of those that fail."""
    cache: dict[str, tuple] = {}
    errors = []
    for job in batch:
        try:
            if job[0] not in cache:
                cache[job[0]] = inputs(job[0])
            tensors = cache[job[0]]
            call(job, tensors)()
            torch.cuda.synchronize()
            errors.append(None)
        except Exception as exc:  # noqa: BLE001 - a failing config is a result of the sweep
            errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
    return errors


def rel_err(got, want) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


def flops(name: str, kernel: str) -> float:
    z, h, n, d, causal = SHAPES[name]
    forward = 4 * z * h * n * n * d / (2 if causal else 1)
    return forward if kernel == "fwd" else 2.5 * forward


def write_rows(path: str, rows: list[dict]) -> None:
    """A sweep's rows as JSON, with the GPU, the torch and Triton versions and the date they were taken on."""
    with open(path, "w") as fh:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                   "date": time.strftime("%Y-%m-%d"), "rows": rows}, fh, indent=1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, epilog=EPILOG)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--kernels", default=",".join(KERNELS), help="which kernels' configs to sweep")
    parser.add_argument("--workers", type=int, default=12)
    parser.add_argument("--loads", choices=["both", "tma", "pointer"], default="both")
    parser.add_argument("--orders", choices=["both", "tile", "head"], default="tile",
                        help="grid order: tiles first (tiles, Z·H), head-first (Z·H, tiles), or both")
    parser.add_argument("--overlap", choices=["both", "off", "on"], default="off",
                        help="the \"overlap\" config flag: off, on, or every config both ways")
    parser.add_argument("--regs", choices=["both", "off", "on"], default="off",
                        help="the \"regs\" config flag (resident tiles in registers), as --overlap")
    parser.add_argument("--candidates", choices=["sweep", "shipped"], default="sweep",
                        help="this script's candidate lists, or the kernels' shipped lists")
    parser.add_argument("--output", default=None, help="write the rows as JSON here")
    args = parser.parse_args()
    names = args.shapes.split(",")
    loads = {"both": (False, True), "tma": (True,), "pointer": (False,)}[args.loads]
    orders = {"both": (False, True), "tile": (False,), "head": (True,)}[args.orders]
    choices = {"both": (False, True), "off": (False,), "on": (True,)}
    toggles = {"overlap": choices[args.overlap], "regs": choices[args.regs]}
    kernels = args.kernels.split(",")
    todo = [j for j in jobs(loads, orders, toggles, args.candidates == "shipped")
            if j[0] in names and j[1] in kernels]
    todo = list(dict.fromkeys(todo))  # a flag asked for that a shipped config already names

    started = time.time()
    batches = [todo[i::args.workers] for i in range(args.workers)]
    errors: dict[tuple, str | None] = {}
    with futures.ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for batch, errs in zip(batches, pool.map(warm, batches), strict=True):
            errors.update(zip(batch, errs, strict=True))
    print(f"compiled {len(todo)} jobs in {time.time() - started:.0f} s", file=sys.stderr)

    rows = []
    for name in names:
        tensors = inputs(name)
        q, k, v, do, out, lse, causal = tensors
        partners = PARTNERS[SHAPES[name][3]]
        reference = flash_backward(q, k, v, out, lse, do, causal, tma=False,
                                   configs_by_kernel={kk: config(c, kk) for kk, c in partners.items()})[:3]
        fwd_reference = out
        for job in (j for j in todo if j[0] == name):
            row = {"shape": name, "kernel": job[1], "tma": job[2], "config": list(job[3]),
                   "partner": list(job[4]) if job[4] else None, "ms": None, "tflops": None, "max_rel_err": None,
                   "error": errors.get(job)}
            if row["error"] is None:
                fn = call(job, tensors)
                result = fn()
                pairs = [(result[0], fwd_reference)] if job[1] == "fwd" else list(zip(result, reference, strict=True))
                row["max_rel_err"] = max(rel_err(a, b) for a, b in pairs)
                row["ms"] = triton.testing.do_bench(fn, warmup=25, rep=100)
                row["tflops"] = flops(name, job[1]) / row["ms"] / 1e9
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
        del tensors, reference, fwd_reference
        torch.cuda.empty_cache()

    device = torch.cuda.get_device_name()
    print(f"# flash_tune: {device}, torch {torch.__version__}, triton {triton.__version__}, "
          f"{time.strftime('%Y-%m-%d')}\n")
    for name in names:
        print(f"## {name} {SHAPES[name]} (Z, H, N, d, causal), bf16\n")
        print("| kernel | loads | config (M, N, warps, stages, *flags) | partner | ms | TFLOP/s "
              "| max rel err vs pointer | error |")
        print("|---|---|---|---|---:|---:|---:|---|")
        group = [r for r in rows if r["shape"] == name]
        group.sort(key=lambda r: (r["kernel"], r["tma"], r["ms"] if r["ms"] is not None else 1e9))
        for r in group:
            ms = f"{r['ms']:.3f}" if r["ms"] is not None else "–"
            tf = f"{r['tflops']:.1f}" if r["tflops"] is not None else "–"
            err = f"{r['max_rel_err']:.1e}" if r["max_rel_err"] is not None else "–"
            loads = "tma" if r["tma"] else "pointer"
            print(f"| {r['kernel']} | {loads} | {tuple(r['config'])} | "
                  f"{tuple(r['partner']) if r['partner'] else ''} | {ms} | {tf} | {err} | {r['error'] or ''} |")
        print()
    if args.output:
        write_rows(args.output, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
