"""What `profiler-kit nsys --backend torch` costs a launch-bound program against a plain `torch.profiler.profile`,
and which of the recorder's instruments the difference comes from.

The program is a tiny training loop whose step is all operator launches (a stack of small Linear + ReLU blocks,
batch 8, AdamW), one intra-op thread; it times each of its own steps by the CPU time of its thread
(`time.thread_time`: what the launches cost, whatever share of the cores other processes take) and by the wall
clock. It runs as a fresh process per variant, the variants interleaved round after round so that all see the
same machine load:

- `plain`: the loop alone;
- `profile`: the loop inside a plain `torch.profiler.profile()` (CPU activity, and CUDA where there is one);
- `profile+marks`: the same with the recorder's automatic marks installed (`recording.marks`: global module and
  optimizer hooks, the backward wrapper);
- `profile+mirror`: the same with the recorder's mirrors of the program's ranges installed (`recording.mirror`:
  `record_function`, `torch.cuda.nvtx`, `nvtx` wrapped);
- `recorder`: the plain loop under `profiler-kit nsys --backend torch` (every instrument, the whole run recorded).

Per run a step's time is the lower quartile of the steps after `--warmup` (the steps other processes disturbed
least); per variant the median of its runs, the runs' range beside it, and the cost against `plain` and against
`profile` in percent, for the thread's CPU time and for the wall time. Processes apart see different load: on a
shared machine that table is as noisy as the runs' ranges say. A second table runs the loop in this process under
one torch.profiler recording, the recorder's automatic marks installed and taken off in alternating blocks of
steps (`--blocks-of` steps each), so both sides see the same load: the lower quartile of each side's steps. A third
table gives, in this process, what each piece costs once, with and without torch.profiler on: a `record_function`
range, one of the recorder's marks (`nvtx_ranges.mark_start`/`mark_end`, a `record_function` under
torch.profiler), and a module call without and with the marks' global module hooks (each the fastest of `--trials`
trials). Prints Markdown tables.
Run it from the repository root with the project's python (PYTHONPATH=$PWD where the package is not installed):

    python tools/torch_backend_cost.py --rounds 5 --steps 300
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARIANTS = ("plain", "profile", "profile+marks", "profile+mirror", "recorder")
REPO = Path(__file__).resolve().parents[1]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="runs of each variant, interleaved (default: 5)")
    parser.add_argument("--steps", type=int, default=300, help="steps per run (default: 300)")
    parser.add_argument("--warmup", type=int, default=50, help="leading steps of a run left out (default: 50)")
    parser.add_argument("--blocks", type=int, default=8, help="Linear + ReLU blocks of the model (default: 8)")
    parser.add_argument("--width", type=int, default=64, help="width of each Linear (default: 64)")
    parser.add_argument("--alternations", type=int, default=20, help="blocks of each side in the second table "
                        "(default: 20)")
    parser.add_argument("--blocks-of", type=int, default=10, help="steps per block in the second table (default: 10)")
    parser.add_argument("--trials", type=int, default=30, help="trials of each piece (default: 30)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args()


def loop(args: argparse.Namespace):
    """The launch-bound training step: a function that runs one and returns [CPU ms of this thread, wall ms]."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(args.width, args.width), torch.nn.ReLU())
                                  for _ in range(args.blocks)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(8, args.width)

    def step() -> list[float]:
        began, cpu = time.perf_counter(), time.thread_time()
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        return [(time.thread_time() - cpu) * 1000, (time.perf_counter() - began) * 1000]

    return step


def child(args: argparse.Namespace) -> None:
    """One run of the loop: each step's [CPU ms of this thread, wall ms] into `args.out` as a JSON list."""
    import torch

    from profiler_kit.recording import mirror
    from profiler_kit.recording.marks import Marks
    from profiler_kit.recording.notes import Notes

    step = loop(args)
    if args.child == "profile+marks":
        Marks(Notes()).install()
    if args.child == "profile+mirror":
        mirror.install(Notes())
    profiled = args.child.startswith("profile")
    with torch.profiler.profile() if profiled else contextlib.nullcontext():
        times = [step() for _ in range(args.steps)]
    args.out.write_text(json.dumps(times))


def alternating(args: argparse.Namespace) -> dict[str, float]:
    """CPU ms of a step (lower quartile) under one torch.profiler recording, without and with the marks, in
    alternating blocks after `args.warmup` steps."""
    import torch

    from profiler_kit.recording.marks import Marks
    from profiler_kit.recording.notes import Notes

    step, marks = loop(args), Marks(Notes())
    sides: dict[str, list[float]] = {"profile": [], "profile+marks": []}
    with torch.profiler.profile():
        for _ in range(args.warmup):
            step()
        for block in range(2 * args.alternations):
            on = block % 2 == 1
            if on:
                marks.install()
            sides["profile+marks" if on else "profile"] += [step()[0] for _ in range(args.blocks_of)]
            if on:
                marks.remove()
    return {side: lower_quartile(times) for side, times in sides.items()}


def run(variant: str, args: argparse.Namespace, folder: Path) -> tuple[float, float]:
    """One run of `variant` in a fresh process: the median CPU and wall ms of its steps after the warm-up."""
    out = folder / f"{variant}.json"
    loop = [sys.executable, __file__, "--child", "plain" if variant == "recorder" else variant, "--out", str(out),
            "--steps", str(args.steps), "--blocks", str(args.blocks), "--width", str(args.width)]
    if variant == "recorder":
        loop = [sys.executable, "-m", "profiler_kit", "nsys", "--backend", "torch", "--force", "--format", "json",
                "-o", str(folder / "recorded"), "--", *loop]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    subprocess.run(loop, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    steps = json.loads(out.read_text())[args.warmup:]
    return lower_quartile([cpu for cpu, _ in steps]), lower_quartile([wall for _, wall in steps])


def lower_quartile(values: list[float]) -> float:
    return statistics.quantiles(values, n=4)[0]


def pieces(trials: int) -> list[tuple[str, float, float]]:
    """(piece, µs without torch.profiler, µs with it) of each piece: the fastest of `trials` trials of 1000."""
    import torch
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

    from profiler_kit import nvtx_ranges
    from profiler_kit.recording.marks import Marks
    from profiler_kit.recording.notes import Notes

    torch.set_num_threads(1)
    layers = torch.nn.Sequential(*[torch.nn.Identity() for _ in range(99)])
    x = torch.zeros(1)
    marks = Marks(Notes())

    def ranged() -> None:
        with torch.profiler.record_function("range"):
            pass

    def marked() -> None:
        nvtx_ranges.mark_end(nvtx_ranges.mark_start("forward"))

    def hooked_calls() -> None:  # 100 module calls; the marks' hooks return at once for all but the outermost
        handles = [register_module_forward_pre_hook(marks._module_pre),
                   register_module_forward_hook(marks._module_post, always_call=True)]
        try:
            layers(x)
        finally:
            for handle in handles:
                handle.remove()

    def fastest(fn, calls: int = 1000, per: int = 1) -> float:
        best = float("inf")
        for _ in range(trials):
            began = time.thread_time()
            for _ in range(calls // per):
                fn()
            best = min(best, (time.thread_time() - began) / calls * 1e6)
        return best

    cases = [("a record_function range", ranged, 1), ("one of the recorder's marks", marked, 1),
             ("a module call", lambda: layers(x), 100), ("a module call with the marks' hooks", hooked_calls, 100)]
    rows = []
    for name, fn, per in cases:
        plain = fastest(fn, per=per)
        with torch.profiler.profile():
            profiled = fastest(fn, per=per)
        rows.append((name, plain, profiled))
    return rows


def main() -> None:
    args = parse_args()
    if args.child:
        child(args)
        return
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        sys.exit(f"unknown variants: {', '.join(sorted(unknown))}")
    medians: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.rounds):
            for variant in variants:
                medians[variant].append(run(variant, args, Path(folder)))
    print("| variant | CPU ms a step | runs' range | against plain | against profile "
          "| wall ms a step | runs' range | against plain | against profile |")
    print("|---|" + "---:|" * 8)
    for variant, runs in medians.items():
        cells = []
        for clock in (0, 1):
            step = {v: statistics.median(r[clock] for r in rs) for v, rs in medians.items()}
            values = [r[clock] for r in runs]
            cells += [f"{step[variant]:.3f}", f"{max(values) - min(values):.3f}"]
            cells += [f"{(step[variant] / step[base] - 1) * 100:+.1f}%" if base in step and base != variant else ""
                      for base in ("plain", "profile")]
        print(f"| {variant} | " + " | ".join(cells) + " |")
    within = alternating(args)
    print("\n| in one process, alternating blocks | CPU ms a step | against profile |\n|---|---:|---:|")
    for side, ms in within.items():
        print(f"| {side} | {ms:.3f} | {(ms / within['profile'] - 1) * 100:+.1f}% |")
    print("\n| piece | µs without torch.profiler | µs under torch.profiler |\n|---|---:|---:|")
    for name, plain, profiled in pieces(args.trials):
        print(f"| {name} | {plain:.2f} | {profiled:.2f} |")

if __name__ == "__main__":
    main()
