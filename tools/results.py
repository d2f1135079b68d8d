"""Re-run the GPU figures that README.md and docs/ show, store their rows, and rewrite the figures from the rows.

Each part runs profiler-kit commands on this machine's GPU and writes their rows to docs/data/results/PART.jsonl,
every row stamped with the commit, date, GPU, torch version and command that produced it. Then every block
`<!-- results:NAME -->...<!-- /results -->` in README.md, docs/*.md and docs/results/*.md is rewritten from the
stored rows, so no figure in them is typed by hand.

    PYTHONPATH=$PWD python3 tools/results.py --only leaderboard,attention-d128   # run these parts, then render
    PYTHONPATH=$PWD python3 tools/results.py --render       # only rewrite the blocks from the stored rows
    PYTHONPATH=$PWD python3 tools/results.py --list         # the parts, their commands and durations

`make results [ONLY=PART,...|render]` does the same. One GPU call may be short: run a few parts at a time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "docs" / "data" / "results"
PAGES = ("README.md", "docs/*.md", "docs/results/*.md")
BLOCK = re.compile(r"(<!-- results:([\w.-]+) -->)(.*?)(<!-- /results -->)", re.DOTALL)
MIB_PER_GIB = 1024


@dataclass(frozen=True)
class Part:
    """Commands (profiler-kit arguments) whose rows make one data file. A `rows` command is given `--output FILE`
    and its rows are read back; a `memory` command prints one JSON report, stored as one row."""

    commands: tuple[tuple[str, ...], ...]
    minutes: float  # about, on one H100
    kind: str = "rows"


TRAIN = ("benchmark", "--ctx", "512", "--mode", "train", "--mixed-precision", "--attention", "flash,sdpa")
# Compiling a config takes minutes: one part per model and optimizer, the warm-up capped once compiled.
GRAPHS = (*TRAIN, "--compile", "--cuda-graphs", "--warmup", "3", "--max-warmup", "15")
GRAPH_PARTS = tuple(f"train-step-graphs-{m}-{o}" for m in ("xl", "2.7B") for o in ("fused", "master"))
ATTENTION = ("attention", "bench", "--dtype", "bf16")
LEADERBOARD = (*ATTENTION, "--impl", "flash-triton,sdpa-flash,sdpa-cudnn,sdpa-efficient", "--batch", "1",
               "--heads", "16", "--seq", "16384", "--d", "64", "--causal")
MEMORY = ("memory", "--model", "xl", "--ctx", "256", "--mode", "train", "--mixed-precision")
D128 = (*ATTENTION, "--impl", "flash-triton,sdpa-cudnn,sdpa-flash", "--batch", "4", "--heads", "16", "--d", "128")

PARTS: dict[str, Part] = {
    "leaderboard": Part((LEADERBOARD,), 2),
    "attention-d128": Part(((*D128, "--seq", "4096", "--causal"), (*D128, "--seq", "8192", "--no-causal")), 3),
    "train-step": Part(((*TRAIN, "--optimizer", "adamw-fused,adamw-master", "--model", "xl,2.7B"),), 4),
    **{f"train-step-graphs-{m}-{o}": Part(((*GRAPHS, "--optimizer", f"adamw-{o}", "--model", m),), 8)
       for m in ("xl", "2.7B") for o in ("fused", "master")},
    "optimizers": Part((("benchmark", "--model", "xl", "--ctx", "512", "--mode", "train", "--mixed-precision",
                         "--attention", "sdpa", "--optimizer", "adamw-fused,adamw-foreach"),), 2),
    "memory-xl": Part(tuple((*MEMORY, "--optimizer", o) for o in ("adamw-fused", "adamw-foreach")), 3, "memory"),
}


def command_text(args: tuple[str, ...]) -> str:
    return "profiler-kit " + " ".join(args)


# ------------------------------------------------------------------------------------------------ running


def stamp() -> dict:
    """What every row of this run records: commit (with -dirty when tracked files differ), date, torch, GPU."""
    git = lambda *a: subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True).stdout.strip()  # noqa: E731
    commit = git("rev-parse", "--short=10", "HEAD") + ("-dirty" if git("status", "--porcelain", "-uno") else "")
    import torch

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {"commit": commit, "date": datetime.date.today().isoformat(), "torch": torch.__version__, "gpu": gpu}


def run_part(name: str, base: dict) -> list[dict]:
    """Every row of part `name`, run now, each with `base`, its command and its GPU."""
    part, rows = PARTS[name], []
    for args in part.commands:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "rows.jsonl"
            extra = ["--output", str(out)] if part.kind == "rows" else ["--output-dir", tmp, "--no-html", "--no-plot",
                                                                         "--format", "json"]
            print(f"{name}: {command_text(args)}", file=sys.stderr, flush=True)
            done = subprocess.run([sys.executable, "-m", "profiler_kit", *args, *extra], cwd=REPO,
                                  env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, text=True)
            if part.kind == "rows":
                sys.stdout.write(done.stdout)
            if done.returncode != 0 or (part.kind == "rows" and not out.is_file()):
                raise SystemExit(f"Error: {name}: `{command_text(args)}` exited with status {done.returncode}")
            found = ([json.loads(line) for line in out.read_text().splitlines()] if part.kind == "rows"
                     else [memory_row(json.loads(done.stdout), args)])
            rows += [{**row, **base, "command": command_text(args)} for row in found]
    return rows


def memory_row(report: dict, args: tuple[str, ...]) -> dict:
    """The figures of one `profiler-kit memory --format json` report: the trace's peak, its phase and the bytes
    of each role alive at it."""
    return {"optimizer": args[args.index("--optimizer") + 1], "peak_allocated_bytes": report["peak"]["allocated_bytes"],
            "peak_phase": report["peak"]["phase"],
            "role_bytes": {r["role"]: r["size_bytes"] for r in report["roles_at_peak"]}}


def write_rows(name: str, rows: list[dict]) -> None:
    DATA.mkdir(parents=True, exist_ok=True)
    (DATA / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def read_rows(name: str) -> list[dict]:
    path = DATA / f"{name}.jsonl"
    if not path.is_file():
        raise SystemExit(f"Error: no rows of part {name} in {path}: run --only {name} on a GPU")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ------------------------------------------------------------------------------------------------ rendering


def pick(rows: list[dict], **want) -> dict:
    """The one row whose columns have the given values."""
    found = [r for r in rows if all(r.get(k) == v for k, v in want.items())]
    if len(found) != 1:
        raise SystemExit(f"Error: {len(found)} rows match {want}, expected one")
    return found[0]


def gib(mib: float) -> str:
    return f"{mib / MIB_PER_GIB:.1f} GiB"


def render_leaderboard() -> str:
    rows = read_rows("leaderboard")
    ms = {r["impl"]: r["fwd_bwd_ms"] for r in rows}
    return (f"flash-triton {ms['flash-triton']:.2f} ms forward+backward, cuDNN {ms['sdpa-cudnn']:.2f} ms, SDPA "
            f"FlashAttention-2 {ms['sdpa-flash']:.2f} ms, memory-efficient {ms['sdpa-efficient']:.2f} ms")


def render_attention_d128() -> str:
    rows = read_rows("attention-d128")
    causal = {r["impl"]: r for r in rows if r["seq"] == 4096 and r["causal"]}
    full = {r["impl"]: r for r in rows if r["seq"] == 8192 and not r["causal"]}
    return (f"flash-triton forward {causal['flash-triton']['fwd_tflops']:.1f} TFLOP/s causal, "
            f"{full['flash-triton']['fwd_tflops']:.1f} non-causal; forward+backward flash-triton / cuDNN "
            f"{causal['flash-triton']['fwd_bwd_ms']:.3f} / {causal['sdpa-cudnn']['fwd_bwd_ms']:.3f} ms causal, "
            f"{full['flash-triton']['fwd_bwd_ms']:.2f} / {full['sdpa-cudnn']['fwd_bwd_ms']:.2f} ms non-causal")


def _train_table(rows: list[dict], with_mfu: bool) -> str:
    """Per weights kind and model: flash / sdpa mean step times (and MFU), and the largest peak allocated."""
    parts = []
    for optimizer, weights in (("adamw-fused", "fp32 weights"), ("adamw-master", "bf16 weights (`adamw-master`)")):
        models = []
        for model in ("xl", "2.7B"):
            flash, sdpa = (pick(rows, model=model, optimizer=optimizer, attention=a) for a in ("flash", "sdpa"))
            mfu = f" ({flash['mfu_pct']:.1f} / {sdpa['mfu_pct']:.1f}% MFU)" if with_mfu else ""
            models.append(f"{model} {flash['total_ms']:.1f} / {sdpa['total_ms']:.1f} ms{mfu}")
        parts.append(f"{weights}: {', '.join(models)}")
    peak = max(r["peak_allocated_mib"] for r in rows)
    return "; ".join(parts) + f"; peak allocated {gib(peak)}"


def render_train_step() -> str:
    return "means, flash / sdpa: " + _train_table(read_rows("train-step"), with_mfu=False)


def render_train_step_graphs() -> str:
    rows = [row for name in GRAPH_PARTS for row in read_rows(name)]
    return "means, flash / sdpa: " + _train_table(rows, with_mfu=True)


def render_optimizers() -> str:
    rows = read_rows("optimizers")
    fused, foreach = (pick(rows, optimizer=o)["optimizer_ms"] for o in ("adamw-fused", "adamw-foreach"))
    return f"optimizer step {fused:.1f} ms fused, {foreach:.1f} ms foreach"


ORDER = {"xl": 0, "2.7B": 1, "adamw-fused": 0, "adamw-master": 1, "adamw-foreach": 2, "flash": 0, "sdpa": 1}


def bench_table(rows: list[dict]) -> str:
    """Benchmark rows as a Markdown table, eager before graphed, then by model, optimizer and attention."""
    lines = ["| model | attention | optimizer | compile | forward | backward | optimizer step | total | total median "
             "| tokens/s | MFU % | peak allocated MiB |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    key = lambda r: (bool(r["compile"]), *(ORDER[r[c]] for c in ("model", "optimizer", "attention")))  # noqa: E731
    for r in sorted(rows, key=key):
        compiled = "graphs" if r.get("cuda_graphs") else "yes" if r["compile"] else "no"
        lines.append(
            f"| {r['model']} | {r['attention']} | {r['optimizer']} | {compiled} | {r['forward_ms']:.1f} "
            f"| {r['backward_ms']:.1f} | {r['optimizer_ms']:.1f} | {r['total_ms']:.1f} ± {r['total_ms_std']:.1f} "
            f"| {r['total_ms_median']:.1f} | {r['tokens_per_s']:,.0f} | {r['mfu_pct']:.1f} "
            f"| {r['peak_allocated_mib']:,.0f} |")
    return "\n" + "\n".join(lines) + "\n"


def render_train_step_table() -> str:
    return bench_table([row for name in ("train-step", *GRAPH_PARTS) for row in read_rows(name)])


def render_optimizers_table() -> str:
    return bench_table(read_rows("optimizers"))


def render_memory() -> str:
    """Per AdamW: the trace's peak in GiB, its phase, and bytes per parameter of the roles alive at it."""
    from profiler_kit.presets import count_parameters, from_name

    if not (DATA / "memory-xl.jsonl").is_file():
        return "not measured on this commit yet: `make results ONLY=memory-xl`"
    params = count_parameters(from_name("xl", 256))
    parts = []
    for optimizer, label in (("adamw-fused", "fused AdamW (default)"), ("adamw-foreach", "foreach")):
        row = pick(read_rows("memory-xl"), optimizer=optimizer)
        roles = ", ".join(f"{role} {row['role_bytes'].get(role, 0) / params:.1f}"
                          for role in ("parameter", "gradient", "optimizer state"))
        parts.append(f"{label}: peak {row['peak_allocated_bytes'] / 2**30:.1f} GiB in `{row['peak_phase']}` "
                     f"(bytes per parameter alive at it: {roles})")
    return "; ".join(parts)


def markdown(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table, text columns left-aligned and the rest right-aligned, between blank lines."""
    align = ["---" if i == 0 or header[i] in ("causal",) else "---:" for i in range(len(header))]
    lines = [header, align, *rows]
    return "\n" + "\n".join("| " + " | ".join(line) + " |" for line in lines) + "\n"


def render_leaderboard_table() -> str:
    """Fastest forward+backward first; each ratio is the other implementation's ms over this one's."""
    rows = sorted(read_rows("leaderboard"), key=lambda r: r["fwd_bwd_ms"])
    by_impl = {r["impl"]: r for r in rows}
    others = ("sdpa-cudnn", "sdpa-flash")
    header = ["impl", "fwd_ms", "bwd_ms", "fwd_bwd_ms", "fwd_bwd_p20_ms", "fwd_bwd_p80_ms", "fwd_tflops",
              "fwd_bwd_tflops", *(f"fwd_bwd_vs_{o}" for o in others)]
    return markdown(header, [[r["impl"], *(f"{r[c]:.2f}" for c in header[1:6]), *(f"{r[c]:.1f}" for c in header[6:8]),
                              *(f"{by_impl[o]['fwd_bwd_ms'] / r['fwd_bwd_ms']:.3f}" for o in others)] for r in rows])


def render_attention_d128_table() -> str:
    rows = read_rows("attention-d128")
    header = ["impl", "seq", "causal", "fwd_ms", "bwd_ms", "fwd_bwd_ms", "fwd_bwd_p20_ms", "fwd_bwd_p80_ms",
              "fwd_tflops", "bwd_tflops", "fwd_bwd_tflops"]
    return markdown(header, [[r["impl"], str(r["seq"]), "yes" if r["causal"] else "no",
                              *(f"{r[c]:.3f}" for c in header[3:8]), *(f"{r[c]:.1f}" for c in header[8:])]
                             for r in rows])


def measured(parts: tuple[str, ...]) -> Callable[[], str]:
    """A renderer of the GPU, torch, dates and commits of the stored rows of those `parts` that have rows."""

    def render() -> str:
        rows = [row for name in parts if (DATA / f"{name}.jsonl").is_file() for row in read_rows(name)]
        values = lambda key: ", ".join(sorted({str(r.get(key) or "not recorded") for r in rows}))  # noqa: E731
        return f"{values('gpu')}, torch {values('torch')}, {values('date')}, commit {values('commit')}"

    return render


RENDERERS: dict[str, Callable[[], str]] = {
    "leaderboard": render_leaderboard,
    "attention-d128": render_attention_d128,
    "train-step": render_train_step,
    "train-step-graphs": render_train_step_graphs,
    "optimizers": render_optimizers,
    "train-step-table": render_train_step_table,
    "optimizers-table": render_optimizers_table,
    "leaderboard-table": render_leaderboard_table,
    "memory": render_memory,
    "attention-d128-table": render_attention_d128_table,
    "measured": measured(tuple(PARTS)),
    "measured-benchmark": measured(("train-step", *GRAPH_PARTS, "optimizers")),
    "measured-attention": measured(("leaderboard", "attention-d128")),
}


def render_text(text: str) -> str:
    def replace(match: re.Match) -> str:
        name = match.group(2)
        if name not in RENDERERS:
            raise SystemExit(f"Error: unknown results block {name!r}; known: {', '.join(RENDERERS)}")
        return match.group(1) + RENDERERS[name]() + match.group(4)

    return BLOCK.sub(replace, text)


def render() -> list[Path]:
    """Rewrite every results block in the pages; return the pages that changed."""
    changed = []
    for pattern in PAGES:
        for page in sorted(REPO.glob(pattern)):
            text = page.read_text()
            new = render_text(text)
            if new != text:
                page.write_text(new)
                changed.append(page)
    return changed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help=f"comma-separated parts to run: {', '.join(PARTS)} (default: all)")
    parser.add_argument("--render", action="store_true", help="only rewrite the blocks from the stored rows")
    parser.add_argument("--list", action="store_true", help="print the parts, their commands and durations")
    args = parser.parse_args(argv)
    if args.list:
        for name, part in PARTS.items():
            print(f"{name} (about {part.minutes:g} min on one H100):")
            for command in part.commands:
                print(f"    {command_text(command)}")
        return
    if not args.render:
        names = args.only.split(",") if args.only else list(PARTS)
        unknown = [n for n in names if n not in PARTS]
        if unknown:
            parser.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
        base = stamp()
        for name in names:
            write_rows(name, run_part(name, base))
    for page in render():
        print(f"rewrote {page.relative_to(REPO)}", file=sys.stderr)


if __name__ == "__main__":
    main()
