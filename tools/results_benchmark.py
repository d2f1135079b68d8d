"""The benchmark's figures (docs/results/benchmark-h100.md, README, docs/nsys.md) from the stored rows: steadiness,
the train step eager and with CUDA graphs, the optimizer beside the backward against the plain compiled script,
the optimizers, and the kernel time of the 2.7B step and the GPU's idle time under Nsight Systems."""

from __future__ import annotations

from results_pages import (
    COMPILED_PARTS,
    GRAPH_PARTS,
    MODELS,
    NS_PER_MS,
    OVERLAP_PARTS,
    WEIGHTS,
    cite,
    gib,
    markdown,
    pick,
    read_rows,
    spread,
    std_pct,
    values,
)

ORDER = {"small": 0, "medium": 1, "large": 2, "xl": 3, "2.7B": 4, "adamw-fused": 0, "adamw-master": 1,
         "adamw-foreach": 2, "flash": 0, "sdpa": 1, "naive": 2, "forward": 0, "train": 1}
STEADY_PCT = 2.0  # the std/mean a steady row stays within
TARGETS_MS = {"2.7B": 100.0, "xl": 70.0}  # the train step with CUDA graphs and adamw-master, ctx 512, B4
ADAMW_BYTES_PER_PARAM = 28  # bf16 gradient read; fp32 master, both moments read and written; bf16 weight written


def _ms(value: float | None, digits: int = 1) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def graph_rows() -> list[dict]:
    return read_rows(*GRAPH_PARTS)


# ------------------------------------------------------------------------------------------------ train step


def _train_summary(rows: list[dict], with_mfu: bool) -> str:
    """Per weights kind and model: flash / sdpa mean step times (and MFU), and the largest peak allocated."""
    parts = []
    for optimizer, weights in WEIGHTS.items():
        models = []
        for model in MODELS:
            flash, sdpa = (pick(rows, model=model, optimizer=optimizer, attention=a) for a in ("flash", "sdpa"))
            mfu = f" ({flash['mfu_pct']:.1f} / {sdpa['mfu_pct']:.1f}% MFU)" if with_mfu else ""
            models.append(f"{model} {flash['total_ms']:.1f} / {sdpa['total_ms']:.1f} ms{mfu}")
        parts.append(f"{weights}: {', '.join(models)}")
    peak = max(r["peak_allocated_mib"] for r in rows)
    return "means, flash / sdpa: " + "; ".join(parts) + f"; peak allocated {gib(peak)}" + cite(rows)


def render_train_step() -> str:
    return _train_summary(read_rows("train-step"), with_mfu=False)


def render_train_step_graphs() -> str:
    return _train_summary(graph_rows(), with_mfu=True)


def bench_table(rows: list[dict]) -> str:
    """Benchmark rows as a Markdown table, eager before graphed, then by model, optimizer and attention;
    `optimizer step` is the update's time after the backward (all of it unless it ran beside the backward)."""
    header = ["model", "attention", "optimizer", "compile", "forward", "backward", "optimizer step", "total",
              "total median", "tokens/s", "MFU %", "peak allocated MiB", "commit"]
    key = lambda r: (bool(r["compile"]), bool(r.get("optimizer_overlap")),  # noqa: E731
                     *(ORDER[r[c]] for c in ("model", "optimizer", "attention")))
    lines = []
    for r in sorted(rows, key=key):
        compiled = "graphs" if r.get("cuda_graphs") else "yes" if r["compile"] else "no"
        compiled += ", overlap" if r.get("optimizer_overlap") else ""
        lines.append([r["model"], r["attention"], r["optimizer"], compiled, _ms(r["forward_ms"]),
                      _ms(r["backward_ms"]), _ms(r["optimizer_ms"]), f"{r['total_ms']:.1f} ± {r['total_ms_std']:.1f}",
                      _ms(r["total_ms_median"]), f"{r['tokens_per_s']:,.0f}", _ms(r["mfu_pct"]),
                      f"{r['peak_allocated_mib']:,.0f}", values([r], "commit")])
    return markdown(header, lines, left=["attention", "optimizer", "compile", "commit"])


def render_train_step_table() -> str:
    return bench_table(read_rows("train-step", *GRAPH_PARTS))


def render_graphs_steadiness() -> str:
    rows = graph_rows()
    return (f"where a step takes {spread([r['total_ms'] for r in rows], 0)} ms, std/mean is "
            f"{spread([std_pct(r) for r in rows])}%" + cite(rows))


def _flash_minus_sdpa(rows: list[dict]) -> str:
    pairs = []
    for model in MODELS:
        for optimizer, weights in (("adamw-fused", "fp32"), ("adamw-master", "bf16")):
            flash, sdpa = (pick(rows, model=model, optimizer=optimizer, attention=a) for a in ("flash", "sdpa"))
            pairs.append(f"{model} {weights} {flash['total_ms'] - sdpa['total_ms']:+.1f} ms")
    return ", ".join(pairs)


def render_train_step_notes() -> str:
    graphs, eager = graph_rows(), read_rows("train-step")
    fused, master = ({m: pick(graphs, model=m, optimizer=o, attention="flash") for m in MODELS}
                     for o in ("adamw-fused", "adamw-master"))
    host = [r["host_cpu_ms"] / r["total_ms"] * 100 for r in eager]
    relative = [abs(pick(graphs, model=r["model"], optimizer=r["optimizer"], attention="flash")["total_ms"]
                    / r["total_ms"] - 1) * 100 for r in graphs if r["attention"] == "sdpa"]
    return (
        f"\n- **bf16 weights with fp32 masters** (`adamw-master`): with CUDA graphs and flash attention 2.7B runs in "
        f"{master['2.7B']['total_ms']:.1f} ms ({master['2.7B']['mfu_pct']:.1f}% MFU) against "
        f"{fused['2.7B']['total_ms']:.1f} ms with fp32 weights, xl in {master['xl']['total_ms']:.1f} against "
        f"{fused['xl']['total_ms']:.1f} ms; the optimizer step takes {master['2.7B']['optimizer_ms']:.1f} against "
        f"{fused['2.7B']['optimizer_ms']:.1f} ms (2.7B), and the peak allocated is "
        f"{gib(master['2.7B']['peak_allocated_mib'])} against {gib(fused['2.7B']['peak_allocated_mib'])}"
        + cite(graphs) + ".\n"
        f"- **With CUDA graphs** std/mean is {spread([std_pct(r) for r in graphs])}% and `flash` is within "
        f"{max(relative):.1f}% of `sdpa` (flash − sdpa: {_flash_minus_sdpa(graphs)})" + cite(graphs) + ".\n"
        f"- **Eager**, `host_cpu_ms` is {spread(host, 0)}% of the step (flash − sdpa: {_flash_minus_sdpa(eager)})"
        + cite(eager) + ".\n")


# ------------------------------------------------------------------------------------------------ overlap


def _overlap_rows() -> tuple[list[dict], list[dict], list[dict]]:
    """The rows with the optimizer beside the backward, the same configs without it, the plain script's."""
    stored = read_rows(*OVERLAP_PARTS)
    beside = [r for r in stored if r.get("optimizer_overlap")]
    plain = [r for r in stored if r.get("script") == "plain"]
    after = [r for r in graph_rows() if r["optimizer"] == "adamw-master"]
    return beside, after, plain


def render_overlap_table() -> str:
    beside, after, plain = _overlap_rows()
    header = ["model", "attention", "optimizer", "forward", "backward", "opt_exposed_ms", "total", "total median",
              "MFU %", "peak allocated MiB", "commit"]
    lines = []
    for r in sorted(after + beside, key=lambda r: (ORDER[r["model"]], ORDER[r["attention"]],
                                                   bool(r.get("optimizer_overlap")))):
        how = "adamw-master, beside the backward" if r.get("optimizer_overlap") else "adamw-master, after it"
        lines.append([r["model"], r["attention"], how, _ms(r["forward_ms"]), _ms(r["backward_ms"]),
                      _ms(r["opt_exposed_ms"] if r.get("opt_exposed_ms") is not None else r["optimizer_ms"]),
                      f"{r['total_ms']:.1f} ± {r['total_ms_std']:.1f}", _ms(r["total_ms_median"]), _ms(r["mfu_pct"]),
                      f"{r['peak_allocated_mib']:,.0f}", values([r], "commit")])
    for r in sorted(plain, key=lambda r: ORDER[r["model"]]):
        lines.append([r["model"], r["attention"], "fused AdamW, fp32 weights: plain compiled script", "", "", "",
                      f"{r['total_ms']:.1f}", "", _ms(r["mfu_pct"]), f"{r['peak_allocated_mib']:,.0f}",
                      values([r], "commit")])
    return markdown(header, lines, left=["attention", "optimizer", "commit"])


def render_overlap_summary() -> str:
    beside, after, plain = _overlap_rows()
    sentences = []
    for model in MODELS:
        ours = {r["attention"]: r for r in beside if r["model"] == model}
        best = min(ours.values(), key=lambda r: r["total_ms"])
        before = pick(after, model=model, attention=best["attention"])
        anchor = [r for r in plain if r["model"] == model]
        versus = f", the plain compiled script {anchor[0]['total_ms']:.1f} ms" if anchor else ""
        met = "met" if best["total_ms"] <= TARGETS_MS[model] else "not met"
        sentences.append(
            f"{model}: {best['total_ms']:.1f} ms a step with `{best['attention']}` ({best['mfu_pct']:.1f}% MFU; the "
            f"≤ {TARGETS_MS[model]:g} ms target {met}), the optimizer exposed for {best['opt_exposed_ms']:.1f} ms; "
            f"without the overlap {before['total_ms']:.1f} ms, {before['optimizer_ms']:.1f} ms of it after the "
            f"backward{versus}")
    return "; ".join(sentences) + cite(beside + after + plain)


def render_train_step_overlap() -> str:
    """The README's line: each model's step with the optimizer beside the backward, without it, and the plain
    compiled script."""
    beside, after, plain = _overlap_rows()
    parts = []
    for model in MODELS:
        ours, before = (pick(rows, model=model, attention="sdpa") for rows in (beside, after))
        anchor = [r for r in plain if r["model"] == model]
        parts.append(f"{model} {ours['total_ms']:.1f} ms ({ours['mfu_pct']:.1f}% MFU, optimizer exposed "
                     f"{ours['opt_exposed_ms']:.1f} ms) against {before['total_ms']:.1f} ms without"
                     + (f" and {anchor[0]['total_ms']:.1f} ms for the plain compiled script" if anchor else ""))
    return "sdpa: " + "; ".join(parts) + cite(beside + after + plain)


# ------------------------------------------------------------------------------------------------ optimizers


def render_optimizers() -> str:
    rows = read_rows("optimizers")
    fused, foreach = (pick(rows, optimizer=o)["optimizer_ms"] for o in ("adamw-fused", "adamw-foreach"))
    return f"optimizer step {fused:.1f} ms fused, {foreach:.1f} ms foreach" + cite(rows)


def render_optimizers_table() -> str:
    return bench_table(read_rows("optimizers"))


def render_optimizers_summary() -> str:
    rows = read_rows("optimizers")
    fused, foreach = (pick(rows, optimizer=o) for o in ("adamw-fused", "adamw-foreach"))
    return (f"The fused AdamW step takes {fused['optimizer_ms']:.1f} ms against {foreach['optimizer_ms']:.1f} ms for "
            f"foreach ({foreach['optimizer_ms'] / fused['optimizer_ms']:.1f}× as long), and the whole step's median "
            f"is {fused['total_ms_median']:.1f} against {foreach['total_ms_median']:.1f} ms (backward "
            f"{fused['backward_ms']:.1f} against {foreach['backward_ms']:.1f} ms)" + cite(rows) + ".")


# ------------------------------------------------------------------------------------------------ steadiness


def _passes(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: (ORDER[r["model"]], ORDER[r["mode"]], r.get("repeat") or 1))


def _steadiness_line(r: dict, with_spread: bool, spreads: dict) -> list[str]:
    warmup = f"{r['warmup']}" + ("" if r.get("warmup_stable", True) else " (cap)")
    digits = 1 if with_spread else 2
    line = [r["model"], r["mode"], str(r.get("repeat") or 1), warmup, f"{r['total_ms']:.{digits}f}",
            f"{std_pct(r):.1f}", f"{r['total_ms_median']:.{digits}f}",
            f"{r['total_ms_p10']:.{digits}f}–{r['total_ms_p90']:.{digits}f}"]
    if with_spread:
        first = (r.get("repeat") or 1) == 1
        line.append(f"{spreads[(r['model'], r['mode'])]:.1f}" if first else "")
    return [*line, values([r], "commit")]


def _repeat_spreads(rows: list[dict]) -> dict[tuple[str, str], float]:
    """(max − min) / mean of the pass medians of each model and mode, in percent."""
    medians: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        medians.setdefault((r["model"], r["mode"]), []).append(r["total_ms_median"])
    return {k: (max(v) - min(v)) / (sum(v) / len(v)) * 100 for k, v in medians.items()}


def render_steadiness_table() -> str:
    rows = read_rows("steadiness")
    spreads = _repeat_spreads(rows)
    header = ["model", "mode", "pass", "warm-up", "mean ms", "std/mean %", "median ms", "p10–p90 ms",
              "repeat spread %", "commit"]
    return markdown(header, [_steadiness_line(r, True, spreads) for r in _passes(rows)], left=["mode", "commit"])


def render_steadiness_summary() -> str:
    rows = read_rows("steadiness")
    spreads = _repeat_spreads(rows)
    steady = [r for r in rows if std_pct(r) <= STEADY_PCT]
    low, high = min(spreads, key=spreads.get), max(spreads, key=spreads.get)
    verdict = "met" if len(steady) == len(rows) else "not met"
    return (f"**The ≤ {STEADY_PCT:g}% std/mean target is {verdict} for eager steps on this machine:** std/mean is "
            f"{spread([std_pct(r) for r in rows])}% per row ({len(steady)} of {len(rows)} rows within it), and the "
            f"two passes' medians differ by {spreads[low]:.1f}% ({' '.join(low)}) to {spreads[high]:.1f}% "
            f"({' '.join(high)})" + cite(rows) + ".")


def render_host_cpu_table() -> str:
    rows = sorted(read_rows("host-cpu"), key=lambda r: ORDER[r["mode"]])
    header = ["mode", "total ms", "total median, p10–p90 ms", "host CPU ms", "host CPU median, p10–p90 ms", "commit"]
    lines = [[r["mode"], f"{r['total_ms']:.1f} ± {r['total_ms_std']:.1f}",
              f"{r['total_ms_median']:.1f}, {r['total_ms_p10']:.1f}–{r['total_ms_p90']:.1f}",
              f"{r['host_cpu_ms']:.1f} ± {r['host_cpu_ms_std']:.1f}",
              f"{r['host_cpu_ms_median']:.1f}, {r['host_cpu_ms_p10']:.1f}–{r['host_cpu_ms_p90']:.1f}",
              values([r], "commit")] for r in rows]
    return markdown(header, lines, left=["commit"])


def render_host_cpu_summary() -> str:
    rows = sorted(read_rows("host-cpu"), key=lambda r: ORDER[r["mode"]])
    parts = [f"{r['mode']}: {r['host_cpu_ms'] / r['total_ms'] * 100:.0f}% of the mean step, "
             f"{abs(r['total_ms'] - r['host_cpu_ms']):.1f} ms apart, with a std of {r['host_cpu_ms_std']:.1f} against "
             f"{r['total_ms_std']:.1f} ms" for r in rows]
    return "The process's CPU time per step is, " + "; ".join(parts) + cite(rows) + "."


def compiled_rows() -> list[dict]:
    return read_rows(*COMPILED_PARTS)


def render_steadiness_compiled_table() -> str:
    header = ["model", "mode", "pass", "warm-up", "mean ms", "std/mean %", "median ms", "p10–p90 ms", "commit"]
    return markdown(header, [_steadiness_line(r, False, {}) for r in _passes(compiled_rows())],
                    left=["mode", "commit"])


def render_steadiness_compiled_summary() -> str:
    compiled, eager = compiled_rows(), read_rows("steadiness")
    shorter = [pick(eager, model=r["model"], mode=r["mode"], repeat=1)["total_ms_median"] / r["total_ms_median"]
               for r in compiled]
    tails = {(r["model"], r["mode"]): (r["total_ms_p90"] / r["total_ms_median"] - 1) * 100 for r in compiled}
    worst = max(tails, key=tails.get)
    return (f"Median steps are {spread(shorter)}× shorter than eager (the first eager pass), and p90 sits "
            f"{spread(list(tails.values()), 0)}% above the median (most for {' '.join(worst)})"
            + cite(compiled + eager) + ".")


# ------------------------------------------------------------------------------------------------ nsys


def _categories(row: dict) -> list[str]:
    return [c for c, ns in sorted(row["categories_ns"].items(), key=lambda kv: -kv[1]) if ns > 0]


def render_nsys_table() -> str:
    rows = read_rows("nsys-2.7B")
    fused, master = (pick(rows, optimizer=o) for o in ("adamw-fused", "adamw-master"))
    header = ["category", "fp32 weights, fused AdamW: kernels", "total ms", "bf16 weights, `adamw-master`: kernels",
              "total ms"]
    order = list(dict.fromkeys(_categories(fused) + _categories(master)))
    lines = [[c, *(cell for r in (fused, master) for cell in (f"{r['category_kernels'].get(c, 0):,}",
                                                             f"{r['categories_ns'].get(c, 0) / NS_PER_MS:.2f}"))]
             for c in order]
    lines.append(["**kernel time in the step**", "", f"**{fused['total_ns'] / NS_PER_MS:.1f}**", "",
                  f"**{master['total_ns'] / NS_PER_MS:.1f}**"])
    return markdown(header, lines) + f"\nCommit {values(rows, 'commit')}, {values(rows, 'date')}.\n"


def render_nsys_summary() -> str:
    from profiler_kit.flops import BACKWARD_FACTOR, gpu_peak, step_flops
    from profiler_kit.presets import count_parameters, from_name

    rows = read_rows("nsys-2.7B")
    master = pick(rows, optimizer="adamw-master")
    cfg = from_name("2.7B", master["ctx"])
    batch, ctx = master["batch_size"], master["ctx"]
    attention = batch * ctx * cfg.num_layers * 2 * (2 * ctx * cfg.d_model) * (1 + BACKWARD_FACTOR)
    matmul_ms = master["categories_ns"]["matmul"] / NS_PER_MS
    tflops = (step_flops(cfg, batch, ctx, "train") - attention) / (matmul_ms / 1e3) / 1e12
    peak = gpu_peak(master.get("gpu"))
    share = f" ({tflops / peak.bf16_tflops * 100:.0f}% of the bf16 peak)" if peak else ""
    adamw_ms = master["categories_ns"]["optimizer"] / NS_PER_MS
    gbytes = ADAMW_BYTES_PER_PARAM * count_parameters(cfg) / 1e9
    idle = [v["idle_pct"] for r in rows for v in r.get("idle", {}).values()]
    idle_text = f"Every phase's GPU is idle at most {max(idle):.1f}% of its span. " if idle else ""
    return (f"{idle_text}With bf16 weights the matmuls run at {tflops:.0f} TFLOP/s{share} (the model's FLOPs less "
            f"attention's, over matmul kernel time) and the AdamW update moves {ADAMW_BYTES_PER_PARAM} bytes per "
            f"parameter ({gbytes:.0f} GB at {gbytes / adamw_ms:.1f} TB/s): together {matmul_ms + adamw_ms:.0f} of the "
            f"{master['total_ns'] / NS_PER_MS:.0f} ms of kernel time" + cite(rows) + ".")


def _idle_commands(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["command"] for r in rows))


def render_nsys_idle_table() -> str:
    rows = read_rows("nsys-idle")
    header = ["command", "phase", "wall ms", "GPU span ms", "busy ms", "idle %", "verdict", "commit"]
    lines = []
    for command in _idle_commands(rows):
        row = pick(rows, command=command)
        shown = command.replace(" --format json --top 100000 --force", "")
        for i, (phase, v) in enumerate(row["idle"].items()):
            lines.append([f"`{shown}`" if i == 0 else "", phase, f"{v['wall_ns'] / NS_PER_MS:.2f}",
                          f"{v['gpu_span_ns'] / NS_PER_MS:.2f}", f"{v['busy_ns'] / NS_PER_MS:.2f}",
                          f"{v['idle_pct']:.1f}", v["verdict"], values([row], "commit") if i == 0 else ""])
    return markdown(header, lines, left=["phase", "verdict", "commit"])


def render_nsys_idle_summary() -> str:
    rows = read_rows("nsys-idle")
    parts = []
    for r in rows:
        phases: dict[str, list[str]] = {}
        for phase, v in r["idle"].items():
            phases.setdefault(v["verdict"], []).append(phase)
        parts.append(f"{r['model']} {r['mode']} at {r['batch_size'] * r['ctx']:,} tokens a step: "
                     + ", ".join(f"{verdict} ({' and '.join(names)})" for verdict, names in phases.items()))
    xl = pick(rows, model="xl", mode="train")["idle"]["optimizer_step"]
    return ("Verdicts: " + "; ".join(parts) + f". The eager xl train step's fused optimizer step is launched in "
            f"{xl['wall_ns'] / NS_PER_MS:.1f} ms and keeps the GPU busy for {xl['busy_ns'] / NS_PER_MS:.1f} ms"
            + cite(rows) + ".")


BENCHMARK_RENDERERS = {
    "train-step": render_train_step,
    "train-step-graphs": render_train_step_graphs,
    "train-step-table": render_train_step_table,
    "train-step-notes": render_train_step_notes,
    "graphs-steadiness": render_graphs_steadiness,
    "train-step-overlap": render_train_step_overlap,
    "overlap-table": render_overlap_table,
    "overlap-summary": render_overlap_summary,
    "optimizers": render_optimizers,
    "optimizers-table": render_optimizers_table,
    "optimizers-summary": render_optimizers_summary,
    "steadiness-table": render_steadiness_table,
    "steadiness-summary": render_steadiness_summary,
    "host-cpu-table": render_host_cpu_table,
    "host-cpu-summary": render_host_cpu_summary,
    "steadiness-compiled-table": render_steadiness_compiled_table,
    "steadiness-compiled-summary": render_steadiness_compiled_summary,
    "nsys-2.7B-table": render_nsys_table,
    "nsys-2.7B-summary": render_nsys_summary,
    "nsys-idle-table": render_nsys_idle_table,
    "nsys-idle-summary": render_nsys_idle_summary,
}
