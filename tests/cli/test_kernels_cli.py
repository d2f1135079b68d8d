"""`profiler-kit kernels summarize|compare` from the command line: the JSON contract, the machine formats,
reports without kernels, and every kind of bad input ending in one line and a non-zero exit."""

from __future__ import annotations

import gzip
import io
import json
import random
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from profiler_kit.cli import main
from profiler_kit.kernels import CATEGORIES, summarize

FIXTURES = Path(__file__).parents[1] / "fixtures" / "kernels"
REPO = Path(__file__).resolve().parents[2]
BF16 = FIXTURES / "h100_tiny_train_bf16.sqlite"
FP32 = FIXTURES / "h100_tiny_train_fp32.sqlite"
CPU_REPORT = FIXTURES / "cpu_tiny_train_nsys2022.nsys-rep"
CONTRACT = {"schema_version", "environment", "source", "time_basis", "kernel_count", "total_ns", "categories",
            "memory_ops_ns", "phases", "phase_rule", "steps", "mfu", "idle", "top_kernels", "runs", "profiler_overhead"}


def run(*args: str):
    return CliRunner().invoke(main, ["kernels", *map(str, args)])


def assert_one_line_error(result) -> str:
    assert result.exit_code != 0
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


@pytest.mark.parametrize(
    "source",
    [
        BF16,
        FIXTURES / "h100_tiny_train_bf16_trace.json.gz",
        FIXTURES / "nsys2025_h100_tiny_train_bf16_cuda_gpu_kern_sum.csv",
        FIXTURES / "nsys2022_tiny_train_bf16_gpukernsum.txt",
    ],
    ids=lambda p: p.name,
)
def test_json_contract(source):
    result = run("summarize", source, "--format", "json", "--top", "5")
    assert result.exit_code == 0, result.output
    obj = json.loads(result.stdout)
    assert set(obj) == CONTRACT
    # The report as one side of a comparison: its runs (a step each, or the whole report) and its kernels.
    assert obj["runs"]["unit"] in ("step", "report") and obj["runs"]["runs"] and obj["runs"]["kernels"]
    assert sum(run["total"] for run in obj["runs"]["runs"]) <= obj["total_ns"]
    assert list(obj["categories"]) == list(CATEGORIES)
    assert all(isinstance(v, int) for v in obj["categories"].values())
    assert sum(obj["categories"].values()) == obj["total_ns"] > 0
    assert obj["kernel_count"] == sum(k["instances"] for k in summarize(source).kernels.to_dict("records"))
    assert len(obj["top_kernels"]) == 5
    assert set(obj["top_kernels"][0]) == {"name", "category", "instances", "total_ns"}
    totals = [k["total_ns"] for k in obj["top_kernels"]]
    assert totals == sorted(totals, reverse=True)
    if source.suffix in (".csv", ".txt"):
        assert obj["phases"] == {} and obj["memory_ops_ns"] is None
    else:
        assert list(obj["phases"]) == ["forward", "backward", "optimizer_step"]
        for phase in obj["phases"].values():
            assert sum(phase["categories"].values()) == phase["total_ns"]
        assert isinstance(obj["memory_ops_ns"], int) and obj["memory_ops_ns"] > 0


def test_phase_option_is_repeatable():
    result = run("summarize", BF16, "--phase", "backward", "--phase", "forward", "--format", "json")
    assert list(json.loads(result.stdout)["phases"]) == ["backward", "forward"]


def test_nvtx_option_adds_the_split_to_json():
    result = run("summarize", BF16, "--nvtx", "attention", "--format", "json")
    obj = json.loads(result.stdout)
    assert set(obj) == CONTRACT | {"nvtx"}
    assert obj["nvtx"]["range"] == "attention"
    assert sum(s["total_ns"] for s in obj["nvtx"]["sub_ranges"].values()) == obj["total_ns"]


@pytest.mark.parametrize("fmt", ["markdown", "md", "table"])
def test_other_formats(fmt):
    result = run("summarize", BF16, "--nvtx", "attention", "--format", fmt)
    assert result.exit_code == 0
    assert all(line.startswith("note: ") for line in result.stderr.splitlines())  # stderr: notes only
    assert "attn_scores" in result.stdout and "matmul" in result.stdout


def test_csv_is_one_table_and_table_picks_another(tmp_path):
    first = run("summarize", BF16, "--nvtx", "attention", "--format", "csv")
    assert first.exit_code == 0
    table = pd.read_csv(io.StringIO(first.stdout))
    assert list(table.columns) == ["category", "kernels", "total_ms", "share_pct"]
    assert table["share_pct"].sum() == pytest.approx(100.0)
    split = run("summarize", BF16, "--nvtx", "attention", "--format", "csv", "--table", "sub_ranges")
    assert "attn_scores" in set(pd.read_csv(io.StringIO(split.stdout))["sub_range"])
    every = run("summarize", BF16, "--format", "csv", "--csv-dir", tmp_path / "tables")
    assert every.stdout == run("summarize", BF16, "--format", "csv").stdout
    written = sorted(p.name for p in (tmp_path / "tables").iterdir())
    assert "categories.csv" in written and "phases.csv" in written
    assert all(len(pd.read_csv(tmp_path / "tables" / name)) for name in written)
    unknown = run("summarize", BF16, "--format", "csv", "--table", "nope")
    assert unknown.exit_code == 2 and "phases" in unknown.stderr


def test_notes_go_to_stderr_in_machine_formats():
    result = run(
        "summarize", FIXTURES / "nsys2025_h100_tiny_train_bf16_cuda_gpu_kern_sum_msec.csv", "--format", "json"
    )
    assert result.exit_code == 0
    json.loads(result.stdout)
    assert "rounded to 100 ns" in result.stderr


def test_compare_marks_each_note_with_its_side():
    msec = FIXTURES / "nsys2025_h100_tiny_train_bf16_cuda_gpu_kern_sum_msec.csv"
    result = run("compare", BF16, msec, "--format", "csv")
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stderr.splitlines() if line.startswith("note: ")]
    assert notes and all(line.startswith(("note: A: ", "note: B: ")) for line in notes)
    assert any(line.startswith("note: B: ") and "rounded to 100 ns" in line for line in notes)
    assert "note:" not in result.stdout
    table = run("compare", BF16, msec)
    assert "note: B: " in table.stdout


def test_a_report_without_kernels_lists_its_nvtx_ranges():
    source = FIXTURES / "cpu_tiny_train_nsys2022.sqlite"
    result = run("summarize", source)
    assert result.exit_code == 0, result.output
    assert "0 kernels" in result.stdout and "NVTX ranges (no kernels" in result.stdout
    for name in ("forward", "backward", "optimizer_step", "attn_scores", "layer_1"):
        assert name in result.stdout
    obj = json.loads(run("summarize", source, "--format", "json").stdout)
    assert obj["kernel_count"] == 0 and obj["total_ns"] == 0 and obj["memory_ops_ns"] is None


def test_compare():
    result = run("compare", BF16, FP32, "--format", "json", "--top", "3")
    assert result.exit_code == 0, result.output
    obj = json.loads(result.stdout)
    a, b = summarize(BF16), summarize(FP32)
    rows = {r["category"]: r for r in obj["categories"]}
    assert rows["matmul"]["a_ns"] == a.category_ns()["matmul"]
    assert rows["matmul"]["b_ns"] == b.category_ns()["matmul"]
    assert rows["total"]["delta_ns"] == b.total_ns - a.total_ns
    assert rows["matmul"]["speedup"] == pytest.approx(a.category_ns()["matmul"] / b.category_ns()["matmul"])
    assert [r["phase"] for r in obj["phases"]] == ["forward", "backward", "optimizer_step"]
    # The kernels that moved most: at least --top of them, and enough to explain 90% of the change.
    moved = sum(k["delta_ns"] for k in obj["top_kernels"])
    assert len(obj["top_kernels"]) >= 3 and abs(moved - (b.total_ns - a.total_ns)) <= 0.1 * abs(b.total_ns - a.total_ns)
    assert obj["explained_pct"] == pytest.approx(100 * moved / (b.total_ns - a.total_ns))
    table = run("compare", BF16, FP32)
    assert table.exit_code == 0 and "speedup" in table.stdout



def plain_sqlite(path: Path) -> Path:
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE results (model TEXT, ms REAL)")
    return path


def written(name: str, data: bytes):
    def make(tmp: Path) -> Path:
        (tmp / name).write_bytes(data)
        return tmp / name

    return make


def existing(path: Path):
    return lambda tmp: path


SQLITE = BF16.read_bytes()
# case → (how to make the file in a temporary folder, a phrase its one-line error must contain)
BAD_INPUTS = {
    "missing": (lambda tmp: tmp / "nothing-here.sqlite", "no such file"),
    "directory": (lambda tmp: tmp, "a directory"),
    "empty": (written("empty.sqlite", b""), "empty file"),
    "random bytes": (written("random.bin", random.Random(0).randbytes(4096)), "binary data"),
    "truncated sqlite": (
        written("truncated.sqlite", SQLITE[: len(SQLITE) // 3]),
        "damaged or truncated SQLite",
    ),
    "not an nsys sqlite": (lambda tmp: plain_sqlite(tmp / "results.sqlite"), "not an Nsight Systems export"),
    "csv of another report": (
        existing(FIXTURES / "nsys2022_tiny_train_bf16_cudaapisum.csv"),
        "another report",
    ),
    "nvtx_kern_sum": (
        existing(FIXTURES / "nsys2025_h100_tiny_train_bf16_nvtx_kern_sum.txt"),
        "nvtx_kern_sum",
    ),
    "text file": (
        written("notes.txt", b"profiler-kit results\n\nmatmul is 60% of the step\n"),
        "without an `nsys stats` table",
    ),
    "json, not a trace": (written("config.json", b'{"model": "tiny"}'), "not a Chrome trace"),
    "broken json": (written("trace.json", b'{"traceEvents": [{"ph": "X",'), "not valid JSON"),
    "truncated gzip": (
        written("trace.json.gz", gzip.compress(b'{"traceEvents": []}' * 50)[:40]),
        "damaged or truncated gzip",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line(tmp_path, case):
    make, phrase = BAD_INPUTS[case]
    line = assert_one_line_error(run("summarize", make(tmp_path)))
    assert phrase in line


def test_nsys_report_without_nsys_is_one_line(tmp_path, isolated_nsys_search):
    report = tmp_path / CPU_REPORT.name
    shutil.copyfile(CPU_REPORT, report)
    line = assert_one_line_error(run("summarize", report))
    assert "nsys (Nsight Systems) not found" in line


def test_unknown_nvtx_range_is_one_line():
    line = assert_one_line_error(run("summarize", BF16, "--nvtx", "nope"))
    assert "attn_scores" in line


def test_errors_of_the_real_command_have_no_traceback(tmp_path):
    """The installed entry point, not the test runner: what a user sees."""
    (tmp_path / "empty.csv").write_bytes(b"")
    proc = subprocess.run(
        [sys.executable, "-m", "profiler_kit", "kernels", "summarize", str(tmp_path / "empty.csv")],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [f"Error: {tmp_path / 'empty.csv'}: empty file"]


def test_nsys_report_is_exported_beside_itself_and_read(tmp_path, nsys, monkeypatch):  # noqa: F811
    """A CPU report of nsys 2022.4: exported to SQLite on first use, NVTX ranges and no kernels."""
    monkeypatch.setenv("NSYS", str(nsys.path))
    report = tmp_path / CPU_REPORT.name
    shutil.copyfile(CPU_REPORT, report)
    result = run("summarize", report, "--format", "json")
    assert result.exit_code == 0, result.output
    assert report.with_suffix(".sqlite").is_file()
    obj = json.loads(result.stdout)
    assert obj["kernel_count"] == 0 and list(obj["phases"]) == ["forward", "backward", "optimizer_step"]
