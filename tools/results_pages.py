"""The rows `tools/results.py` stores (docs/data/results/PART.jsonl), the formats every figure shares, and the
renderers of the attention, memory and provenance blocks (the benchmark page's are in `results_benchmark.py`).

A renderer reads the rows of the parts it shows and returns a block's text. Every block says the commit its figures
come from: tables in a `commit` column, sentences at their end. A part with no rows raises `NotMeasured`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "docs" / "data" / "results"
MIB_PER_GIB = 1024
NS_PER_MS = 1e6
MODELS = ("xl", "2.7B")
GRAPH_PARTS = tuple(f"train-step-graphs-{m}-{o}" for m in MODELS for o in ("fused", "master"))
OVERLAP_PARTS = tuple(f"train-step-overlap-{m}" for m in MODELS)
COMPILED_PARTS = ("steadiness-compiled-small-medium", "steadiness-compiled-large-xl")
BENCHMARK_PARTS = ("steadiness", "host-cpu", *COMPILED_PARTS, "train-step", *GRAPH_PARTS, *OVERLAP_PARTS,
                   "optimizers", "nsys-2.7B")
WEIGHTS = {"adamw-fused": "fp32 weights", "adamw-master": "bf16 weights (`adamw-master`)"}


class NotMeasured(Exception):
    """A part has no stored rows: its blocks say so."""


# ------------------------------------------------------------------------------------------------ rows


def write_rows(name: str, rows: list[dict]) -> None:
    DATA.mkdir(parents=True, exist_ok=True)
    (DATA / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def read_rows(*names: str) -> list[dict]:
    """The stored rows of these parts, in order."""
    rows = []
    for name in names:
        path = DATA / f"{name}.jsonl"
        if not path.is_file():
            raise NotMeasured(name)
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


def option(args: tuple[str, ...], flag: str, default: str | None = None) -> str | None:
    return args[args.index(flag) + 1] if flag in args else default


def memory_row(report: dict, args: tuple[str, ...]) -> dict:
    """The figures of one `profiler-kit memory --format json` report: the trace's peak, its phase and the bytes
    of each role alive at it."""
    return {"optimizer": option(args, "--optimizer"), "peak_allocated_bytes": report["peak"]["allocated_bytes"],
            "peak_phase": report["peak"]["phase"],
            "role_bytes": {r["role"]: r["size_bytes"] for r in report["roles_at_peak"]}}


def nsys_row(report: dict, args: tuple[str, ...]) -> dict:
    """The figures of one `profiler-kit nsys --format json --top N` summary: kernel time and kernels per
    category (from the kernel table, which --top makes whole), and where each phase's GPU idles."""
    kernels: dict[str, int] = {}
    for kernel in report["top_kernels"]:
        kernels[kernel["category"]] = kernels.get(kernel["category"], 0) + kernel["instances"]
    idle = {phase: {k: v[k] for k in ("wall_ns", "gpu_span_ns", "busy_ns", "idle_pct", "verdict")}
            for phase, v in report["idle"].items()}
    return {"model": option(args, "--model"), "ctx": int(option(args, "--ctx")),
            "batch_size": int(option(args, "--batch-size", "4")), "mode": option(args, "--mode", "train"),
            "optimizer": option(args, "--optimizer", "adamw-fused"), "kernel_count": report["kernel_count"],
            "total_ns": report["total_ns"], "categories_ns": report["categories"], "category_kernels": kernels,
            "idle": idle}


def pick(rows: list[dict], **want) -> dict:
    """The one row whose columns have the given values."""
    found = [r for r in rows if all(r.get(k) == v for k, v in want.items())]
    if len(found) != 1:
        raise SystemExit(f"Error: {len(found)} rows match {want}, expected one")
    return found[0]


# ------------------------------------------------------------------------------------------------ formats


def values(rows: Iterable[dict], key: str) -> str:
    return ", ".join(sorted({str(r.get(key) or "not recorded") for r in rows}))


def cite(rows: list[dict]) -> str:
    """The commit(s) of the rows, as a sentence's end."""
    return f" (commit {values(rows, 'commit')})"


def gib(mib: float) -> str:
    return f"{mib / MIB_PER_GIB:.1f} GiB"


def spread(values_: list[float], digits: int = 1) -> str:
    """`a–b` of the smallest and largest value, or one value when they print alike."""
    low, high = f"{min(values_):.{digits}f}", f"{max(values_):.{digits}f}"
    return low if low == high else f"{low}–{high}"


def markdown(header: list[str], rows: list[list[str]], left: Iterable[str] = ()) -> str:
    """A Markdown table between blank lines: the first column and those in `left` left-aligned."""
    left = {header[0], *left}
    lines = [header, ["---" if h in left else "---:" for h in header], *rows]
    return "\n" + "\n".join("| " + " | ".join(line) + " |" for line in lines) + "\n"


def std_pct(row: dict) -> float:
    return row["total_ms_std"] / row["total_ms"] * 100


# ------------------------------------------------------------------------------------------------ attention


def render_leaderboard() -> str:
    rows = read_rows("leaderboard")
    ms = {r["impl"]: r["fwd_bwd_ms"] for r in rows}
    return (f"flash-triton {ms['flash-triton']:.2f} ms forward+backward, cuDNN {ms['sdpa-cudnn']:.2f} ms, SDPA "
            f"FlashAttention-2 {ms['sdpa-flash']:.2f} ms, memory-efficient {ms['sdpa-efficient']:.2f} ms"
            + cite(rows))


def render_attention_d128() -> str:
    rows = read_rows("attention-d128")
    causal = {r["impl"]: r for r in rows if r["seq"] == 4096 and r["causal"]}
    full = {r["impl"]: r for r in rows if r["seq"] == 8192 and not r["causal"]}
    return (f"flash-triton forward {causal['flash-triton']['fwd_tflops']:.1f} TFLOP/s causal, "
            f"{full['flash-triton']['fwd_tflops']:.1f} non-causal; forward+backward flash-triton / cuDNN "
            f"{causal['flash-triton']['fwd_bwd_ms']:.3f} / {causal['sdpa-cudnn']['fwd_bwd_ms']:.3f} ms causal, "
            f"{full['flash-triton']['fwd_bwd_ms']:.2f} / {full['sdpa-cudnn']['fwd_bwd_ms']:.2f} ms non-causal"
            + cite(rows))


def render_leaderboard_table() -> str:
    """Fastest forward+backward first; each ratio is the other implementation's ms over this one's."""
    rows = sorted(read_rows("leaderboard"), key=lambda r: r["fwd_bwd_ms"])
    by_impl = {r["impl"]: r for r in rows}
    others = ("sdpa-cudnn", "sdpa-flash")
    header = ["impl", "fwd_ms", "bwd_ms", "fwd_bwd_ms", "fwd_bwd_p20_ms", "fwd_bwd_p80_ms", "fwd_tflops",
              "fwd_bwd_tflops", *(f"fwd_bwd_vs_{o}" for o in others), "commit"]
    return markdown(header, [[r["impl"], *(f"{r[c]:.2f}" for c in header[1:6]), *(f"{r[c]:.1f}" for c in header[6:8]),
                              *(f"{by_impl[o]['fwd_bwd_ms'] / r['fwd_bwd_ms']:.3f}" for o in others),
                              values([r], "commit")] for r in rows], left=["commit"])


def render_attention_d128_table() -> str:
    rows = read_rows("attention-d128")
    header = ["impl", "seq", "causal", "fwd_ms", "bwd_ms", "fwd_bwd_ms", "fwd_bwd_p20_ms", "fwd_bwd_p80_ms",
              "fwd_tflops", "bwd_tflops", "fwd_bwd_tflops", "commit"]
    return markdown(header, [[r["impl"], str(r["seq"]), "yes" if r["causal"] else "no",
                              *(f"{r[c]:.3f}" for c in header[3:8]), *(f"{r[c]:.1f}" for c in header[8:11]),
                              values([r], "commit")] for r in rows], left=["causal", "commit"])


# ------------------------------------------------------------------------------------------------ memory


def render_memory() -> str:
    """Per AdamW: the trace's peak in GiB, its phase, and bytes per parameter of the roles alive at it."""
    from profiler_kit.presets import count_parameters, from_name

    params = count_parameters(from_name("xl", 256))
    rows = read_rows("memory-xl")
    parts = []
    for optimizer, label in (("adamw-fused", "fused AdamW (default)"), ("adamw-foreach", "foreach")):
        row = pick(rows, optimizer=optimizer)
        roles = ", ".join(f"{role} {row['role_bytes'].get(role, 0) / params:.1f}"
                          for role in ("parameter", "gradient", "optimizer state"))
        parts.append(f"{label}: peak {row['peak_allocated_bytes'] / 2**30:.1f} GiB in `{row['peak_phase']}` "
                     f"(bytes per parameter alive at it: {roles})")
    return "; ".join(parts) + cite(rows)


# ------------------------------------------------------------------------------------------------ provenance


def measured(parts: tuple[str, ...]) -> Callable[[], str]:
    """A renderer of the GPU, torch, dates and commits of the stored rows of those `parts` that have rows."""

    def render() -> str:
        rows = [row for name in parts if (DATA / f"{name}.jsonl").is_file() for row in read_rows(name)]
        return f"{values(rows, 'gpu')}, torch {values(rows, 'torch')}, {values(rows, 'date')}, commit " \
               f"{values(rows, 'commit')}"

    return render


def render_benchmark_environment() -> str:
    rows = [row for name in BENCHMARK_PARTS if (DATA / f"{name}.jsonl").is_file() for row in read_rows(name)]
    return (f"**GPU:** {values(rows, 'gpu')} (driver {values(rows, 'driver')}), torch {values(rows, 'torch')}, "
            f"triton {values(rows, 'triton')}. **Dates:** {values(rows, 'date')}. **Commits:** "
            f"{values(rows, 'commit')}.")


def measured_all() -> str:
    """The GPU, torch, dates and commits of every stored part."""
    return measured(tuple(p.stem for p in sorted(DATA.glob("*.jsonl"))))()
