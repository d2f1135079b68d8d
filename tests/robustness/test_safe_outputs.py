"""Nothing lost: result files are checked before any work and appended under a lock, rows that cannot be
written are kept and printed, and a failed run leaves the previous report, plot or file as it was."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from profiler_kit import benchmark as bench
from profiler_kit.cli import main
from profiler_kit.errors import ProfilerKitError
from profiler_kit.files import publish, replaced_when_complete
from profiler_kit.recording.builtin import profile
from profiler_kit.results_io import RowWriter, read_rows
from profiler_kit.workload import WorkloadConfig

MEMORY = Path(__file__).resolve().parents[1] / "fixtures" / "memory"
KERNELS = Path(__file__).resolve().parents[1] / "fixtures" / "kernels"
FAST = ["--model", "tiny", "--ctx", "8", "--batch-size", "1", "--steps", "1", "--warmup", "0",
        "--max-warmup", "0", "--device", "cpu"]
COLUMNS = ("model", "ctx", "status", "total_ms")


def row(i: int) -> dict:
    return {"model": "tiny", "ctx": i, "status": "ok", "total_ms": 1.5 * i}


@pytest.fixture
def no_runs(monkeypatch) -> list:
    """Configs the benchmark would have run (none, when the output is refused up front)."""
    ran: list = []
    monkeypatch.setattr(bench, "run_config", lambda item, *args: ran.append(item))
    return ran


@pytest.mark.parametrize("make", [
    lambda tmp: (tmp / "file").write_text("x") and tmp / "file" / "out.csv",  # the folder is a file
    lambda tmp: Path("/proc/out.csv"),  # a folder nothing can be created in
])
def test_an_unwritable_output_is_refused_before_any_config_runs(tmp_path, no_runs, make):
    result = CliRunner().invoke(main, ["benchmark", *FAST, "--output", str(make(tmp_path) or tmp_path)])
    assert result.exit_code == 1 and no_runs == []
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_foreign_file_is_refused_not_appended_to(tmp_path, no_runs):
    foreign = tmp_path / "people.csv"
    foreign.write_text("name,email\nada,ada@example.org\n")
    result = CliRunner().invoke(main, ["benchmark", *FAST, "--output", str(foreign)])
    assert result.exit_code == 2 and no_runs == []
    assert "not a results file of this command" in result.stderr
    assert foreign.read_text() == "name,email\nada,ada@example.org\n"


def test_a_jsonl_error_names_its_line_and_not_resume(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"model": "tiny"}\n\n{"model": "x"}\n[1, 2]\n')
    with pytest.raises(ProfilerKitError, match=r"line 4 is a JSON list, not a row") as info:
        RowWriter(path, COLUMNS)
    assert "--resume" not in str(info.value)
    path.write_text('{"model": "tiny"}\n{oops\n')
    with pytest.raises(ProfilerKitError, match=r"line 2 is not valid JSON"):
        read_rows(path)


def _append_many(path: str, start: int) -> None:
    writer = RowWriter(Path(path), COLUMNS)
    for i in range(start, start + 40):
        writer.append(row(i))


@pytest.mark.parametrize("suffix", [".csv", ".md", ".jsonl"])
def test_concurrent_writers_never_interleave_headers(tmp_path, suffix):
    path = tmp_path / f"r{suffix}"
    procs = [multiprocessing.get_context("fork").Process(target=_append_many, args=(str(path), s))
             for s in (0, 1000, 2000)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    rows = read_rows(path)
    assert sorted(r["ctx"] for r in rows) == sorted(i + s for s in (0, 1000, 2000) for i in range(40))
    if suffix != ".jsonl":
        assert path.read_text().count("model") == 1  # one header line


FULL_DISK_SCRIPT = """
import resource, sys
from pathlib import Path
from profiler_kit.results_io import RowWriter
path = Path(sys.argv[1])
writer = RowWriter(path, ("model", "ctx", "status", "message"))
resource.setrlimit(resource.RLIMIT_FSIZE, (path.stat().st_size + 20, path.stat().st_size + 20))
writer.append({"model": "tiny", "ctx": 8, "status": "ok", "message": "x" * 200})
try:
    writer.check_all_written(print)
except Exception as exc:
    print("error:", exc)
"""


def test_a_row_that_cannot_be_written_is_kept_and_the_file_cut_back(tmp_path):
    path = tmp_path / "r.csv"
    RowWriter(path, ("model", "ctx", "status", "message")).append({"model": "tiny", "ctx": 4, "status": "ok"})
    before = path.read_bytes()
    proc = subprocess.run([sys.executable, "-c", FULL_DISK_SCRIPT, str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    kept, error = proc.stdout.splitlines()
    assert json.loads(kept)["ctx"] == 8
    assert error.startswith("error: 1 row(s) could not be written to") and "File too large" in error
    assert path.read_bytes() == before  # the half-written row was cut off


def test_a_sweep_on_a_full_disk_prints_its_rows_and_fails(tmp_path, cli):
    out = tmp_path / "r.jsonl"
    out.write_text(json.dumps({"model": "tiny"}) + "\n")
    before = out.read_bytes()
    proc = cli("benchmark", *FAST, "--ctx", "8,16", "--output", out, "--format", "csv", file_size=len(before))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    printed = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    assert [(r["ctx"], r["status"]) for r in printed] == [(8, "ok"), (16, "ok")]
    assert "2 row(s) could not be written to" in proc.stderr.splitlines()[-1]
    assert out.read_bytes() == before
    assert len(proc.stdout.splitlines()) == 3  # the CSV on stdout still has both rows


# Each option that changes a measurement, set otherwise than in the first run, and the column that records it.
OTHER_SETTINGS = [
    (["--steps", "2"], "steps", 2),
    (["--warmup", "1"], "warmup_min", 1),
    (["--max-warmup", "2"], "max_warmup", 2),
    (["--stable-pct", "3.5"], "stable_pct", 3.5),
    (["--seed", "7"], "seed", 7),
    (["--no-nvtx"], "nvtx", False),
]


# JSON lines keep each value's type; a CSV or Markdown table is read back as text: every setting in the first, one
# setting of each type (int, float, bool) in the others.
TYPED = [setting for setting in OTHER_SETTINGS if setting[1] in ("seed", "stable_pct", "nvtx")]


@pytest.mark.parametrize(("suffix", "settings"), [(".jsonl", OTHER_SETTINGS), (".csv", TYPED), (".md", TYPED)])
def test_resume_reruns_a_config_measured_with_other_settings_and_skips_an_identical_one(tmp_path, suffix, settings):
    out = tmp_path / f"r{suffix}"
    first = [*FAST, "--stable-pct", "2.5", "--output", str(out), "--resume"]

    def rows_after(*other: str) -> list[dict]:
        result = CliRunner().invoke(main, ["benchmark", *first, *other])
        assert result.exit_code == 0, result.output
        return read_rows(out)

    assert len(rows_after()) == len(rows_after()) == 1  # the same settings again: skipped
    for count, (options, column, value) in enumerate(settings, 2):
        rows = rows_after(*options)
        assert len(rows) == count and rows[-1][column] == value and rows[0][column] != value
        assert len(rows_after(*options)) == count


def test_resume_reruns_a_row_without_the_setting_columns(tmp_path):
    out = tmp_path / "r.jsonl"
    assert CliRunner().invoke(main, ["benchmark", *FAST, "--output", str(out)]).exit_code == 0
    (older,) = read_rows(out)
    out.write_text(json.dumps({k: v for k, v in older.items() if k not in ("warmup_min", "seed")}) + "\n")
    again = CliRunner().invoke(main, ["benchmark", *FAST, "--output", str(out), "--resume"])
    assert again.exit_code == 0 and "resume:" not in again.stderr and len(read_rows(out)) == 2


def test_a_results_file_without_a_setting_column_is_refused(tmp_path, no_runs):
    old = tmp_path / "r.csv"
    columns = [c for c in bench.COLUMNS if c not in ("max_warmup", "stable_pct")]
    old.write_text(",".join(columns) + "\n")
    result = CliRunner().invoke(main, ["benchmark", *FAST, "--output", str(old), "--resume"])
    assert result.exit_code == 2 and no_runs == []
    assert "lacks the key column(s) max_warmup, stable_pct" in result.stderr
    assert old.read_text() == ",".join(columns) + "\n"


def test_replaced_when_complete_keeps_the_old_file_on_failure(tmp_path):
    path = tmp_path / "trace.json.gz"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError), replaced_when_complete(path) as partial:
        assert partial.name.endswith(".json.gz") and partial.parent == tmp_path
        partial.write_bytes(b"half")
        raise RuntimeError("the run failed")
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["trace.json.gz"]
    with replaced_when_complete(path) as partial:
        partial.write_bytes(b"new")
    assert path.read_bytes() == b"new" and os.listdir(tmp_path) == ["trace.json.gz"]


def test_a_plot_on_a_full_disk_keeps_the_previous_one(tmp_path, cli):
    png = tmp_path / "timeline.png"
    png.write_bytes(b"previous plot")
    proc = cli("memory", "summarize", MEMORY / "tiny_ctx128_train.pickle", "--plot", png, "--force", file_size=4096)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"{png}: could not be written" in proc.stderr
    assert png.read_bytes() == b"previous plot" and os.listdir(tmp_path) == ["timeline.png"]


def test_a_failed_nsys_run_keeps_the_previous_report_and_export(tmp_path, fake_nsys):
    failing = fake_nsys("echo 'ERROR: the workload crashed' >&2; exit 1")
    out = tmp_path / "out"
    out.mkdir()
    cfg = WorkloadConfig("tiny", 32, "forward", device="cpu")
    report, sqlite = out / f"{cfg.tag()}.nsys-rep", out / f"{cfg.tag()}.sqlite"
    report.write_bytes(b"previous report")
    sqlite.write_bytes(b"previous export")
    with pytest.raises(ProfilerKitError, match="the workload crashed"):
        profile(cfg, 0, 1, "nsys", out, failing, force=True)
    assert report.read_bytes() == b"previous report" and sqlite.read_bytes() == b"previous export"
    assert sorted(os.listdir(out)) == sorted([report.name, sqlite.name])


def test_a_results_file_without_the_key_columns_is_refused(tmp_path, no_runs):
    old = tmp_path / "r.csv"
    old.write_text("model,ctx,mode,status,total_ms\ntiny,8,train,ok,1.5\n")
    result = CliRunner().invoke(main, ["benchmark", *FAST, "--output", str(old)])
    assert result.exit_code == 2 and no_runs == []
    assert "lacks the key column(s)" in result.stderr
    assert "optimizer, optimizer_overlap, clip_grad_norm, repeat" in result.stderr
    assert old.read_text() == "model,ctx,mode,status,total_ms\ntiny,8,train,ok,1.5\n"


def test_resume_with_repeat_runs_only_the_passes_not_in_the_file(tmp_path):
    out = tmp_path / "r.jsonl"
    once = [*FAST, "--output", str(out)]
    assert CliRunner().invoke(main, ["benchmark", *once]).exit_code == 0
    twice = CliRunner().invoke(main, ["benchmark", *once, "--repeat", "2", "--resume"])
    assert twice.exit_code == 0 and "resume: 1 of 2 configs" in twice.stderr
    rows = read_rows(out)
    assert [r["repeat"] for r in rows] == [1, 2] and rows[0]["optimizer"] == rows[1]["optimizer"] is not None


def test_publish_without_overwrite_keeps_a_file_that_appeared(tmp_path):
    path, tmp = tmp_path / "trace.json.gz", tmp_path / ".partial.json.gz"
    tmp.write_bytes(b"new")
    path.write_bytes(b"appeared meanwhile")
    with pytest.raises(ProfilerKitError, match="already exists"):
        publish(tmp, path, overwrite=False)
    assert path.read_bytes() == b"appeared meanwhile" and tmp.read_bytes() == b"new"
    path.unlink()
    publish(tmp, path, overwrite=False)
    assert path.read_bytes() == b"new" and os.listdir(tmp_path) == ["trace.json.gz"]


@pytest.mark.parametrize("command", [["kernels", "timeline", str(KERNELS / "h100_tiny_train_bf16.sqlite"), "-o"],
                                     ["memory", "summarize", str(MEMORY / "h100_plain_phases.pickle"), "--plot"]])
def test_an_output_that_is_a_symbolic_link_loop_is_refused_in_one_line(tmp_path, command):
    loop = tmp_path / "loop.json"
    os.symlink(loop, loop)
    result = CliRunner().invoke(main, [*command, str(loop)])
    assert result.exit_code == 2, result.output
    reason = "a loop of symbolic links (it never reaches a file)"
    assert result.stderr.strip() == f"Error: {loop}: {reason}; give another path"
