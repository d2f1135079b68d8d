"""With a real nsys: the one $PK_TEST_NSYS names, else the one profiler-kit finds, else Debian's Nsight Systems
2022.4, which tools/install_nsys_debian.sh installs into .venv/nsys-debian (`make test` does it first; the `nsys`
fixture does it when needed). On a CPU it records NVTX ranges and OS calls but no CUDA kernels. The tests skip,
with the installer's reason, only when no nsys can be found or installed. The last test needs a GPU."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from profiler_kit.cli import main
from profiler_kit.kernels import load
from profiler_kit.nsys_tool import REPORT_RENAMES, NsysError, export_sqlite, find_nsys, run_stats

WARMUP, STEPS = 1, 2


def tables(sqlite: Path) -> set[str]:
    with sqlite3.connect(sqlite) as db:
        return {row[0] for row in db.execute("select name from sqlite_master where type = 'table'")}


def nvtx_counts(sqlite: Path) -> dict[str, int]:
    """How many times each NVTX push/pop range name occurs (text inline or through StringIds)."""
    query = ("select coalesce(e.text, s.value), count(*) from NVTX_EVENTS e left join StringIds s "
             "on e.textId = s.id where e.end is not null group by 1")
    with sqlite3.connect(sqlite) as db:
        return dict(db.execute(query).fetchall())


def test_report_names_are_those_this_nsys_lists(nsys):
    listed = subprocess.run([str(nsys.path), "stats", "--help-reports"], capture_output=True, text=True)
    assert nsys.new_report_names == (nsys.version[:2] >= (2023, 1))
    for report in REPORT_RENAMES:
        name = nsys.report_name(report)
        assert f"  {name} " in listed.stdout or f"  {name}[" in listed.stdout, report


@pytest.fixture(scope="module")
def cpu_run(nsys, tmp_path_factory):
    """`profiler-kit nsys` on the tiny model, on the CPU, under this nsys."""
    out = tmp_path_factory.mktemp("profiles")
    result = CliRunner().invoke(main, [
        "nsys", "--model", "tiny", "--ctx", "32", "--mode", "train", "--batch-size", "2", "--warmup",
        str(WARMUP), "--steps", str(STEPS), "--device", "cpu", "--nsys", str(nsys.path), "--output-dir",
        str(out), "--format", "json"])
    return result, out


def test_cli_records_report_and_sqlite_on_a_cpu(cpu_run):
    result, out = cpu_run
    report, sqlite = out / "tiny_ctx32_train.nsys-rep", out / "tiny_ctx32_train.sqlite"
    assert report.stat().st_size > 0
    assert sqlite.stat().st_mtime_ns >= report.stat().st_mtime_ns
    assert {"NVTX_EVENTS", "PROCESSES", "StringIds"} <= tables(sqlite)
    # A CPU run launches no CUDA kernels and nsys records no CPU operators: an error that says why, the files kept.
    # Without CUDA there is no capture range (the whole run is recorded, and the user is told); with a GPU beside
    # it, the workload's capture window is recorded and holds no CUDA work.
    assert result.exit_code == 1 and result.stdout == ""
    last = result.stderr.strip().splitlines()[-1]
    if torch.cuda.is_available():
        assert last.startswith(f"Error: {sqlite}: nothing recorded: no CUDA kernels in the steps"), last
        assert last.endswith("the program did no CUDA work there"), last
    else:
        assert f"recorded the whole run, {WARMUP + STEPS} steps" in result.stderr
        assert last.startswith(f"Error: {sqlite}: nothing recorded: no CUDA kernels: there is no CUDA device here")


def test_cpu_run_has_the_workload_and_its_nvtx_ranges_or_says_why_not(cpu_run):
    result, out = cpu_run
    sqlite = out / "tiny_ctx32_train.sqlite"
    with sqlite3.connect(sqlite) as db:
        names = [row[0] for row in db.execute("select name from PROCESSES")]
    assert any("python" in Path(name).name for name in names)
    counts = nvtx_counts(sqlite)
    if "forward" in counts:
        # The whole run is recorded on a CPU: the warm-up steps too.
        for name in ("step", "forward", "backward", "optimizer_step"):
            assert counts[name] == WARMUP + STEPS
    else:
        assert "this nsys also dropped the ranges of the `nvtx` package" in result.stderr


def test_export_and_stats_on_the_recorded_report(nsys, cpu_run, tmp_path):
    _, out = cpu_run
    report = Path(shutil.copy2(out / "tiny_ctx32_train.nsys-rep", tmp_path))
    sqlite = Path(shutil.copy2(out / "tiny_ctx32_train.sqlite", tmp_path))
    fresh = sqlite.stat().st_mtime_ns
    assert export_sqlite(report, nsys) == sqlite and sqlite.stat().st_mtime_ns == fresh
    older = report.stat().st_mtime_ns - 10**9
    os.utime(sqlite, ns=(older, older))
    export_sqlite(report, nsys)
    assert sqlite.stat().st_mtime_ns >= report.stat().st_mtime_ns
    assert "NVTX_EVENTS" in tables(sqlite)

    os.utime(sqlite, ns=(older, older))  # stale again: stats on the report must re-export, not refuse
    kern = run_stats(report, "cuda_gpu_kern_sum", nsys)
    assert f"{nsys.report_name('cuda_gpu_kern_sum')}.py" in kern
    assert sqlite.stat().st_mtime_ns >= report.stat().st_mtime_ns
    assert f"{nsys.report_name('nvtx_sum')}.py" in run_stats(sqlite, "nvtxsum", nsys)


def test_stats_of_a_real_h100_export_match_the_recorded_ones(nsys, tmp_path):
    """The kernel summary of an nsys 2025.3 export (H100), asked by its 2023.1 name, from this nsys."""
    kernels = Path(__file__).parents[1] / "fixtures" / "kernels"
    recorded = (kernels / "nsys2022_tiny_train_bf16_gpukernsum.csv").read_text()
    if nsys.version[:2] != (2022, 4):
        pytest.skip(f"the recorded output is Debian's nsys 2022.4's; this is {nsys.version_str}")
    sqlite = Path(shutil.copy2(kernels / "h100_tiny_train_bf16.sqlite", tmp_path))
    out = run_stats(sqlite, "cuda_gpu_kern_sum", nsys)
    # Everything but the preamble line, which names the files.
    assert out.startswith("Processing [") and out.splitlines()[1:] == recorded.splitlines()[1:]


def test_a_damaged_report_fails_in_one_line(nsys, tmp_path):
    report = tmp_path / "damaged.nsys-rep"
    report.write_bytes(os.urandom(4096))
    with pytest.raises(NsysError) as err:
        export_sqlite(report, nsys)
    assert "\n" not in str(err.value)
    assert "export --type sqlite" in str(err.value) and "damaged.nsys-rep" in str(err.value)
    assert not (tmp_path / "damaged.sqlite").exists()


def test_a_failing_workload_reports_its_own_error(nsys, tmp_path):
    # No SDPA backend but the math one runs on a CPU, and `sdpa-cudnn` forbids that one: the child gives up.
    result = CliRunner().invoke(main, [
        "nsys", "attention", "--impl", "sdpa-cudnn", "--dtype", "fp32", "--batch", "1", "--seq", "16", "--d",
        "16", "--device", "cpu", "--warmup", "0", "--nsys", str(nsys.path), "--output-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert "skipping sdpa-cudnn" in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: profiling attention_fp32_b1_s16_d16_causal failed: "
                           "none of sdpa-cudnn runs")


@pytest.mark.gpu
@pytest.mark.gpu_slow  # records under nsys
def test_gpu_capture_range_holds_only_the_profiled_steps(tmp_path):
    from profiler_kit.recording.builtin import profile
    from profiler_kit.workload import WorkloadConfig

    try:
        gpu_nsys = find_nsys()
    except NsysError as exc:
        pytest.skip(str(exc))
    cfg = WorkloadConfig("tiny", 64, "train", batch_size=2, device="cuda")
    result = profile(cfg, warmup=2, steps=1, backend="nsys", output_dir=tmp_path, nsys_path=gpu_nsys.path)
    assert (result.window.kind, result.window.steps) == ("profiler_kit.capture", 1)
    export = result.summary_source
    assert export.suffix == ".sqlite"
    with sqlite3.connect(export) as db:
        kernels = db.execute("select count(*) from CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    assert kernels > 0
    counts = nvtx_counts(export)
    assert "warmup" not in counts
    ranges = load(export).ranges
    by_kind = ranges.groupby(["name", "kind"]).size()
    # The marked phase and the recorder's mark of each: one of each in the one recorded step, the program's 3rd.
    assert by_kind["forward", "phase"] == by_kind["forward", "auto"] == 1
    assert by_kind["optimizer_step", "phase"] == by_kind["optimizer_step", "auto"] == 1
    assert ranges.loc[(ranges["kind"] == "auto") & (ranges["name"] == "step"), "number"].tolist() == [2]
