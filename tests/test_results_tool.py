"""tools/results.py: `--render` on the committed rows leaves README.md and docs/ as they are (every figure in a
results block is what the stored rows give), blocks are rewritten from the rows, and the figures follow the rows."""

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


def test_render_of_the_committed_rows_changes_nothing(results):
    pages = [page for pattern in results.PAGES for page in sorted(REPO.glob(pattern))]
    names = set()
    for page in pages:
        text = page.read_text()
        assert results.render_text(text) == text, f"{page.relative_to(REPO)}: run python3 tools/results.py --render"
        names |= {match[1] for match in results.BLOCK.findall(text)}
    assert names == set(results.RENDERERS)  # every renderer has a block somewhere


def test_blocks_are_rewritten_from_the_rows(results, tmp_path, monkeypatch):
    monkeypatch.setattr(results, "DATA", tmp_path)
    rows = [{"impl": impl, "fwd_bwd_ms": ms, "commit": "abc", "gpu": "NVIDIA H100 80GB HBM3", "date": "2026-01-02",
             "torch": "2.13"} for impl, ms in (("flash-triton", 4.0), ("sdpa-cudnn", 5.125), ("sdpa-flash", 6.0),
                                              ("sdpa-efficient", 19.0))]
    (tmp_path / "leaderboard.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = "a <!-- results:leaderboard -->old 1.00 ms<!-- /results --> b"
    assert results.render_text(text) == (
        "a <!-- results:leaderboard -->flash-triton 4.00 ms forward+backward, cuDNN 5.12 ms, SDPA FlashAttention-2 "
        "6.00 ms, memory-efficient 19.00 ms<!-- /results --> b")


def test_train_step_figures_from_rows(results, tmp_path, monkeypatch):
    """Step means per model, attention and optimizer, and the peak in GiB from the MiB column (55521 MiB is
    54.2 GiB, not 55.5 GB)."""
    monkeypatch.setattr(results, "DATA", tmp_path)
    measured = [("xl", "flash", "adamw-fused", 204.34, 36773.0), ("xl", "sdpa", "adamw-fused", 186.0, 1),
                ("xl", "flash", "adamw-master", 194.6, 1), ("xl", "sdpa", "adamw-master", 170.0, 1),
                ("2.7B", "flash", "adamw-fused", 167.9, 55521.0), ("2.7B", "sdpa", "adamw-fused", 164.6, 1),
                ("2.7B", "flash", "adamw-master", 153.4, 1), ("2.7B", "sdpa", "adamw-master", 141.0, 1)]
    rows = [{"model": m, "attention": a, "optimizer": o, "total_ms": t, "mfu_pct": None, "peak_allocated_mib": p}
            for m, a, o, t, p in measured]
    (tmp_path / "train-step.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert results.render_train_step() == (
        "means, flash / sdpa: fp32 weights: xl 204.3 / 186.0 ms, 2.7B 167.9 / 164.6 ms; bf16 weights "
        "(`adamw-master`): xl 194.6 / 170.0 ms, 2.7B 153.4 / 141.0 ms; peak allocated 54.2 GiB")


def test_unknown_block_and_missing_rows_are_errors(results, tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match="unknown results block 'nope'"):
        results.render_text("<!-- results:nope --><!-- /results -->")
    monkeypatch.setattr(results, "DATA", tmp_path)
    with pytest.raises(SystemExit, match="run --only optimizers on a GPU"):
        results.render_optimizers()


def test_help_and_list():
    done = subprocess.run([sys.executable, str(TOOL), "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "--only" in done.stdout and "--render" in done.stdout
    done = subprocess.run([sys.executable, str(TOOL), "--list"], capture_output=True, text=True)
    assert done.returncode == 0 and "train-step-graphs-2.7B-master (about" in done.stdout
    done = subprocess.run([sys.executable, str(TOOL), "--only", "nope"], capture_output=True, text=True)
    assert done.returncode == 2 and "unknown part(s) nope" in done.stderr


def test_memory_figures_from_reports(results, tmp_path, monkeypatch):
    """A `memory --format json` report becomes a row; the peak in GiB and bytes per parameter of xl's
    1,998,235,200 parameters."""
    monkeypatch.setattr(results, "DATA", tmp_path)
    assert results.render_memory().startswith("not measured on this commit yet")
    params = 1_998_235_200
    rows = []
    for optimizer, peak, phase, grads in (("adamw-fused", 3 * 2**30, "backward", 0),
                                          ("adamw-foreach", 5 * 2**29, "optimizer_step", 4 * params)):
        report = {"peak": {"allocated_bytes": peak, "phase": phase},
                  "roles_at_peak": [{"role": "parameter", "size_bytes": 4 * params},
                                    {"role": "gradient", "size_bytes": grads},
                                    {"role": "optimizer state", "size_bytes": 8 * params}]}
        rows.append(results.memory_row(report, ("memory", "--model", "xl", "--optimizer", optimizer)))
    results.write_rows("memory-xl", rows)
    assert results.render_memory() == (
        "fused AdamW (default): peak 3.0 GiB in `backward` (bytes per parameter alive at it: parameter 4.0, "
        "gradient 0.0, optimizer state 8.0); foreach: peak 2.5 GiB in `optimizer_step` (bytes per parameter alive "
        "at it: parameter 4.0, gradient 4.0, optimizer state 8.0)")


def test_a_part_runs_and_stamps_its_rows(results, tmp_path, monkeypatch):
    """A part's command runs (here the tiny model on the CPU) and each row it wrote carries the commit, date,
    torch version, GPU and command."""
    args = ("benchmark", "--model", "tiny", "--ctx", "16", "--mode", "forward", "--device", "cpu", "--warmup", "1",
            "--max-warmup", "1", "--steps", "1")
    monkeypatch.setitem(results.PARTS, "cpu-check", results.Part((args,), 1))
    base = results.stamp()
    rows = results.run_part("cpu-check", base)
    assert len(rows) == 1 and rows[0]["model"] == "tiny" and rows[0]["status"] == "ok"
    assert rows[0]["command"] == "profiler-kit " + " ".join(args)
    head = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=REPO, capture_output=True, text=True)
    assert rows[0]["commit"].startswith(head.stdout.strip()) and rows[0]["date"] == base["date"]
    assert rows[0]["torch"] and "gpu" in rows[0]
