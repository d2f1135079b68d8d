"""tools/results.py: `--render` on the committed rows leaves README.md and docs/ as they are (every figure in a
results block is what the stored rows give, with its commit), blocks are rewritten from the rows, the figures
follow the rows, and the parts run in parallel one per GPU (scheduled here with fake parts and CPU commands)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOOL = REPO / "tools" / "results.py"


@pytest.fixture(scope="module")
def results():
    spec = importlib.util.spec_from_file_location("results_tool", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def pages(results, tmp_path, monkeypatch):
    """The renderers, reading and writing rows in an empty folder."""
    monkeypatch.setattr(results.pages, "DATA", tmp_path)
    return results.pages


def test_render_of_the_committed_rows_changes_nothing(results):
    files = [page for pattern in results.PAGES for page in sorted(REPO.glob(pattern))]
    names = set()
    for page in files:
        text = page.read_text()
        assert results.render_text(text) == text, f"{page.relative_to(REPO)}: run tools/results.py --render"
        for _, name, body, _ in results.BLOCK.findall(text):
            names.add(name)
            assert "commit" in body.lower() or body.startswith("not measured yet"), f"{name} names no commit"
    assert names == set(results.renderers())  # every renderer has a block somewhere


def test_blocks_are_rewritten_from_the_rows(results, pages, tmp_path):
    rows = [{"impl": impl, "fwd_bwd_ms": ms, "commit": "abc", "gpu": "NVIDIA H100 80GB HBM3", "date": "2026-01-02",
             "torch": "2.13"} for impl, ms in (("flash-triton", 4.0), ("sdpa-cudnn", 5.125), ("sdpa-flash", 6.0),
                                              ("sdpa-efficient", 19.0))]
    (tmp_path / "leaderboard.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = "a <!-- results:leaderboard -->old 1.00 ms<!-- /results --> b"
    assert results.render_text(text) == (
        "a <!-- results:leaderboard -->flash-triton 4.00 ms forward+backward, cuDNN 5.12 ms, SDPA FlashAttention-2 "
        "6.00 ms, memory-efficient 19.00 ms (commit abc)<!-- /results --> b")


def test_train_step_figures_from_rows(results, pages, tmp_path):
    """Step means per model, attention and optimizer, and the peak in GiB from the MiB column (55521 MiB is
    54.2 GiB, not 55.5 GB)."""
    measured = [("xl", "flash", "adamw-fused", 204.34, 36773.0), ("xl", "sdpa", "adamw-fused", 186.0, 1),
                ("xl", "flash", "adamw-master", 194.6, 1), ("xl", "sdpa", "adamw-master", 170.0, 1),
                ("2.7B", "flash", "adamw-fused", 167.9, 55521.0), ("2.7B", "sdpa", "adamw-fused", 164.6, 1),
                ("2.7B", "flash", "adamw-master", 153.4, 1), ("2.7B", "sdpa", "adamw-master", 141.0, 1)]
    rows = [{"model": m, "attention": a, "optimizer": o, "total_ms": t, "mfu_pct": None, "peak_allocated_mib": p,
             "commit": "c1" if m == "xl" else "c2"} for m, a, o, t, p in measured]
    (tmp_path / "train-step.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert results.renderers()["train-step"]() == (
        "means, flash / sdpa: fp32 weights: xl 204.3 / 186.0 ms, 2.7B 167.9 / 164.6 ms; bf16 weights "
        "(`adamw-master`): xl 194.6 / 170.0 ms, 2.7B 153.4 / 141.0 ms; peak allocated 54.2 GiB (commit c1, c2)")


def test_unknown_blocks_are_errors_and_parts_without_rows_say_how_to_measure_them(results, pages):
    with pytest.raises(SystemExit, match="unknown results block 'nope'"):
        results.render_text("<!-- results:nope --><!-- /results -->")
    assert results.render_text("<!-- results:optimizers -->1.0 ms<!-- /results -->") == (
        "<!-- results:optimizers -->not measured yet: `make results ONLY=optimizers`<!-- /results -->")


def test_help_and_list():
    done = subprocess.run([sys.executable, str(TOOL), "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "--only" in done.stdout and "--render" in done.stdout
    done = subprocess.run([sys.executable, str(TOOL), "--list"], capture_output=True, text=True)
    assert done.returncode == 0 and "train-step-graphs-2.7B-master (about" in done.stdout
    assert "python3 tools/plain_step.py --model 2.7B" in done.stdout
    done = subprocess.run([sys.executable, str(TOOL), "--only", "nope"], capture_output=True, text=True)
    assert done.returncode == 2 and "unknown part(s) nope" in done.stderr


def test_memory_figures_from_reports(pages):
    """A `memory --format json` report becomes a row; the peak in GiB and bytes per parameter of xl's
    1,998,235,200 parameters."""
    params = 1_998_235_200
    rows = []
    for optimizer, peak, phase, grads in (("adamw-fused", 3 * 2**30, "backward", 0),
                                          ("adamw-foreach", 5 * 2**29, "optimizer_step", 4 * params)):
        report = {"peak": {"allocated_bytes": peak, "phase": phase},
                  "roles_at_peak": [{"role": "parameter", "size_bytes": 4 * params},
                                    {"role": "gradient", "size_bytes": grads},
                                    {"role": "optimizer state", "size_bytes": 8 * params}]}
        rows.append({**pages.memory_row(report, ("memory", "--model", "xl", "--optimizer", optimizer)),
                     "commit": "abc"})
    pages.write_rows("memory-xl", rows)
    assert pages.render_memory() == (
        "fused AdamW (default): peak 3.0 GiB in `backward` (bytes per parameter alive at it: parameter 4.0, "
        "gradient 0.0, optimizer state 8.0); foreach: peak 2.5 GiB in `optimizer_step` (bytes per parameter alive "
        "at it: parameter 4.0, gradient 4.0, optimizer state 8.0) (commit abc)")


def test_a_part_runs_and_stamps_its_rows(results, tmp_path, monkeypatch):
    """A part's command runs (here the tiny model on the CPU) and each row it wrote carries the commit, date,
    torch version, GPU and command."""
    args = ("benchmark", "--model", "tiny", "--ctx", "16", "--mode", "forward", "--device", "cpu", "--warmup", "1",
            "--max-warmup", "1", "--steps", "1")
    monkeypatch.setitem(results.PARTS, "cpu-check", results.Part((results.Run(args),), 1))
    base = results.stamp()
    rows = results.run_part("cpu-check", base)
    assert len(rows) == 1 and rows[0]["model"] == "tiny" and rows[0]["status"] == "ok"
    assert rows[0]["command"] == "profiler-kit " + " ".join(args)
    head = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=REPO, capture_output=True, text=True)
    assert rows[0]["commit"].startswith(head.stdout.strip()) and rows[0]["date"] == base["date"]
    assert rows[0]["torch"] and "gpu" in rows[0] and rows[0]["part_seconds"] > 0


def test_parts_run_in_parallel_one_per_gpu_longest_first_and_a_failure_stays_its_own(results):
    """Fake parts of known lengths on three GPUs: each runs once, a GPU runs one part at a time, the longest
    start first, the set takes about the longest GPU's share, and a failing part is reported while the rest
    run."""
    import threading
    import time

    lengths = {"a": 0.4, "b": 0.3, "c": 0.3, "d": 0.2, "e": 0.1, "f": 0.1, "bad": 0.05}
    log, lock = [], threading.Lock()

    def run(name, gpu):
        start = time.monotonic()
        time.sleep(lengths[name])
        with lock:
            log.append((gpu, name, start, time.monotonic()))
        if name == "bad":
            raise RuntimeError("bad: exited with status 1\nmore")

    began = time.monotonic()
    errors = results.run_parallel(list(lengths), ["0", "1", "2"], run, duration=lengths.get)
    wall = time.monotonic() - began
    assert errors == {**dict.fromkeys(set(lengths) - {"bad"}), "bad": "bad: exited with status 1"}
    assert sorted(name for _, name, _, _ in log) == sorted(lengths)
    for gpu in "012":
        spans = sorted((s, e) for g, _, s, e in log if g == gpu)
        assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:], strict=False))
    starts = [name for _, name, _, _ in sorted(log, key=lambda entry: entry[2])]
    assert set(starts[:3]) == {"a", "b", "c"}
    assert wall < 0.9 * sum(lengths.values())


def test_each_gpu_gets_its_own_cores(results):
    assert results.cpu_shares(["0", "1"], list(range(8))) == {"0": [0, 1, 2, 3], "1": [4, 5, 6, 7]}
    assert results.cpu_shares(["0", "1", "2"], [0, 1]) == {"0": [0, 1], "1": [0, 1], "2": [0, 1]}


def test_run_all_writes_each_part_with_its_gpu_and_time(results, pages, monkeypatch):
    """Two CPU parts on two named GPUs: each part's file holds its rows, stamped; the durations stored become the
    next run's schedule."""
    args = ("benchmark", "--model", "tiny", "--ctx", "8", "--mode", "forward", "--device", "cpu", "--warmup", "0",
            "--max-warmup", "0", "--steps", "1")
    for name in ("cpu-one", "cpu-two"):
        monkeypatch.setitem(results.PARTS, name, results.Part((results.Run(args),), 7))
    monkeypatch.setattr(results, "LOGS", pages.DATA / "logs")
    errors = results.run_all(["cpu-one", "cpu-two"], ["0", "1"], {"commit": "abc", "date": "2026-01-02"})
    assert errors == {"cpu-one": None, "cpu-two": None}
    for name in ("cpu-one", "cpu-two"):
        (row,) = pages.read_rows(name)
        assert row["status"] == "ok" and row["commit"] == "abc" and row["command"].startswith("profiler-kit bench")
        assert results.minutes(name) == row["part_seconds"] / 60 < 7
    assert results.minutes("leaderboard") == results.PARTS["leaderboard"].minutes  # no stored rows here


def test_nsys_rows_from_a_real_summary(results, pages):
    """A real `kernels summarize --format json --top N` of the bundled nsys export: kernel time and count per
    category (the counts add up to the kernels), the idle table per phase."""
    done = subprocess.run([sys.executable, "-m", "profiler_kit", "kernels", "summarize",
                           str(REPO / "profiles/examples/small_ctx128_train_bf16.sqlite"), "--top", "100000",
                           "--format", "json"], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    row = pages.nsys_row(report, ("nsys", "--model", "small", "--ctx", "128", "--mixed-precision"))
    assert sum(row["category_kernels"].values()) == row["kernel_count"] == report["kernel_count"]
    assert sum(row["categories_ns"].values()) <= row["total_ns"]
    assert row["optimizer"] == "adamw-fused" and row["batch_size"] == 4 and row["mode"] == "train"
    assert set(row["idle"]) == set(report["phases"]) and all("verdict" in v for v in row["idle"].values())


def _bench_row(model, attention, total, **extra):
    row = {"model": model, "attention": attention, "optimizer": "adamw-master", "compile": True,
           "cuda_graphs": True, "total_ms": total, "total_ms_std": 1.0, "total_ms_median": total,
           "forward_ms": 20.0, "backward_ms": 40.0, "optimizer_ms": 30.0, "opt_exposed_ms": 30.0,
           "tokens_per_s": 1.0, "mfu_pct": 40.0, "peak_allocated_mib": 1024.0, "commit": "c1"}
    return {**row, **extra}


def test_the_overlap_figures_against_the_rows_without_it_and_the_plain_script(results, pages):
    """Each model's faster attention with the overlap, its target met or not, the same attention without the
    overlap, and the plain compiled script, with the commits of all three."""
    for model, totals in (("xl", (80.0, 75.0)), ("2.7B", (110.0, 106.0))):
        for opt in ("fused", "master"):
            rows = [_bench_row(model, a, t, optimizer=f"adamw-{opt}")
                    for a, t in zip(("flash", "sdpa"), totals, strict=True)]
            pages.write_rows(f"train-step-graphs-{model}-{opt}", rows)
        beside = [_bench_row(model, "flash", totals[0] - 12, optimizer_overlap=True, opt_exposed_ms=2.5),
                  _bench_row(model, "sdpa", totals[1] - 6, optimizer_overlap=True, opt_exposed_ms=4.0)]
        plain = {"script": "plain", "model": model, "attention": "sdpa", "total_ms": 2 * totals[0], "mfu_pct": 20.0,
                 "peak_allocated_mib": 2048.0, "commit": "c2"}
        pages.write_rows(f"train-step-overlap-{model}", [*beside, plain])
    summary = results.renderers()["overlap-summary"]()
    assert summary == (
        "xl: 68.0 ms a step with `flash` (40.0% MFU; the ≤ 70 ms target met), the optimizer exposed for 2.5 ms; "
        "without the overlap 80.0 ms, 30.0 ms of it after the backward, the plain compiled script 160.0 ms; 2.7B: "
        "98.0 ms a step with `flash` (40.0% MFU; the ≤ 100 ms target met), the optimizer exposed for 2.5 ms; "
        "without the overlap 110.0 ms, 30.0 ms of it after the backward, the plain compiled script 220.0 ms "
        "(commit c1, c2)")
    table = results.renderers()["overlap-table"]()
    assert table.count("beside the backward") == 4 and "plain compiled script |  |  |  | 220.0 |" in table
    assert results.renderers()["train-step-overlap"]().startswith(
        "sdpa: xl 69.0 ms (40.0% MFU, optimizer exposed 4.0 ms) against 75.0 ms without and 160.0 ms for the plain")
