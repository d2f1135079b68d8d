"""Loading every kind of kernel report, checked against what the real tools say about the same recording:
nsys's own `nsys stats` (2022.4 and 2025.3, CSV and text tables, coarse --timeunit variants) against our
reading of the SQLite export, and a torch.profiler trace of the same workload against the nsys export."""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from profiler_kit.cli import main
from profiler_kit.errors import ProfilerKitError
from profiler_kit.kernels import load
from profiler_kit.kernels.nsys_stats import NS_PER_UNIT, TRUNCATION_MARK, read_stats_table, time_unit, to_ns
from profiler_kit.kernels.sources import sniff

FIXTURES = Path(__file__).parents[1] / "fixtures" / "kernels"
EXAMPLES = Path(__file__).parents[2] / "profiles" / "examples"
BF16 = FIXTURES / "h100_tiny_train_bf16.sqlite"
CPU_SQLITE = FIXTURES / "cpu_tiny_train_nsys2022.sqlite"
TORCH_TRACE = FIXTURES / "h100_tiny_train_bf16_trace.json.gz"

# Every `nsys stats` kernel summary fixture and the SQLite export nsys made it from.
KERNEL_SUMMARIES = {
    **{p.name: BF16 for p in FIXTURES.glob("nsys2022_tiny_train_bf16_gpukernsum*")},
    **{
        p.name: FIXTURES / f"{p.name.split('_cuda_gpu')[0].removeprefix('nsys2025_')}.sqlite"
        for p in FIXTURES.glob("nsys2025_h100_*_cuda_gpu_kern_sum*")
    },
    **{
        p.name: EXAMPLES / "small_ctx128_train_bf16.sqlite"
        for p in FIXTURES.glob("nsys2025_small_*_cuda_gpu_kern_sum*")
    },
}


def per_name(trace) -> dict[str, tuple[int, int]]:
    grouped = trace.kernels.groupby("name", observed=True)[["instances", "total_ns"]].sum()
    return {name: (int(row.instances), int(row.total_ns)) for name, row in grouped.iterrows()}


def test_there_are_stats_fixtures_of_both_nsys_generations():
    assert any(n.startswith("nsys2022_") for n in KERNEL_SUMMARIES)
    assert any(n.startswith("nsys2025_") for n in KERNEL_SUMMARIES)


@pytest.mark.parametrize("name", sorted(KERNEL_SUMMARIES))
def test_stats_output_agrees_with_the_sqlite_export(name):
    """Same kernels, same counts, same times (to the unit's precision); text tables cut long names."""
    stats, export = load(FIXTURES / name), load(KERNEL_SUMMARIES[name])
    ours, theirs = per_name(export), per_name(stats)
    assert stats.kernels["instances"].sum() == len(export.kernels)
    if TRUNCATION_MARK in "".join(theirs):
        # nsys's text table keeps 99 characters and a mark; several kernels can share one cut name.
        cut: dict[str, tuple[int, int]] = {}
        for full, (count, total) in ours.items():
            key = full if len(full) <= 100 else full[:99] + TRUNCATION_MARK
            old_count, old_total = cut.get(key, (0, 0))
            cut[key] = (old_count + count, old_total + total)
        ours = cut
        assert any("cuts long kernel names" in note for note in stats.notes)
    assert ours.keys() == theirs.keys()
    table = read_stats_table((FIXTURES / name).read_text()).frame
    column = next(c for c in table.columns if c.startswith("Total Time"))
    decimals = max(len(v.partition(".")[2]) for v in table[column])
    resolution_ns = NS_PER_UNIT[time_unit([column])] / 10**decimals
    for kernel, (count, total) in ours.items():
        assert theirs[kernel][0] == count, kernel
        if resolution_ns <= 1:
            assert theirs[kernel][1] == total, kernel
        else:  # each printed row is rounded to its last digit
            assert abs(theirs[kernel][1] - total) <= resolution_ns / 2 * count, kernel


def test_ns_and_us_csv_are_identical():
    ns = per_name(load(FIXTURES / "nsys2022_tiny_train_bf16_gpukernsum.csv"))
    us = per_name(load(FIXTURES / "nsys2022_tiny_train_bf16_gpukernsum_usec.csv"))
    assert ns == us


def test_coarse_time_units_say_they_round():
    trace = load(FIXTURES / "nsys2025_h100_tiny_train_bf16_cuda_gpu_kern_sum_msec.csv")
    assert any("rounded to 100 ns" in note for note in trace.notes)
    assert not load(FIXTURES / "nsys2025_h100_tiny_train_bf16_cuda_gpu_kern_sum.csv").notes


def test_thousands_separators_of_new_text_tables():
    text = (FIXTURES / "nsys2025_h100_tiny_train_bf16_cuda_gpu_mem_time_sum.txt").read_text()
    table = read_stats_table(text)
    assert table.report == "cuda_gpu_mem_time_sum"
    assert "," in table.frame["Total Time (ns)"].iloc[0]
    assert to_ns(table.frame["Total Time (ns)"], "ns").sum() == load(BF16).memory_ops["total_ns"].sum()


def test_memory_operations_from_sqlite_match_the_tables():
    with sqlite3.connect(BF16) as con:
        count, total = con.execute(
            "SELECT count(*), sum(end - start) FROM CUPTI_ACTIVITY_KIND_MEMCPY"
        ).fetchone()
    memory = load(BF16).memory_ops
    assert memory["instances"].sum() == count and memory["total_ns"].sum() == total
    assert all(op.startswith("memcpy ") for op in memory["operation"])


def test_torch_trace_memory_operations_and_launches():
    events = json.loads(gzip.decompress(TORCH_TRACE.read_bytes()))["traceEvents"]
    memcpy = [e for e in events if e.get("cat") == "gpu_memcpy"]
    trace = load(TORCH_TRACE)
    assert trace.memory_ops["instances"].sum() == len(memcpy)
    assert len(trace.kernels) == sum(e.get("cat") == "kernel" for e in events)
    # Kernels launched through the driver API (Triton-style cuLaunchKernelEx) are matched too.
    assert (trace.kernels["launch_ns"] >= 0).all()


def test_sqlite_launches_come_from_two_threads():
    """The autograd engine's thread launches backward kernels: the loader keeps every launch, not only
    those of the thread that pushed the NVTX ranges."""
    trace = load(BF16)
    assert (trace.kernels["launch_ns"] >= 0).all()
    with sqlite3.connect(BF16) as con:
        threads = con.execute(
            "SELECT count(DISTINCT r.globalTid) FROM CUPTI_ACTIVITY_KIND_KERNEL k "
            "JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId"
        ).fetchone()[0]
    assert threads == 2
    assert trace.ranges["thread"].nunique() == 1


def test_cpu_only_report_has_ranges_and_no_kernels():
    """nsys 2022.4 recorded the tiny model on CPU: NVTX only. Its own nvtxsum agrees on the ranges."""
    trace = load(CPU_SQLITE)
    assert len(trace.kernels) == 0 and trace.memory_ops is None
    nvtxsum = read_stats_table((FIXTURES / "cpu_tiny_train_nsys2022_nvtxsum.csv").read_text()).frame
    expected = {
        row["Range"]: (int(row["Instances"]), int(row["Total Time (ns)"])) for _, row in nvtxsum.iterrows()
    }
    ranges = trace.ranges.assign(ns=trace.ranges["end_ns"] - trace.ranges["start_ns"]).groupby("name")["ns"]
    assert {name: (int(g.size), int(g.sum())) for name, g in ranges} == expected


def test_torch_cpu_trace_has_ranges_and_no_kernels():
    trace = load(FIXTURES / "cpu_tiny_train_torch.json.gz")
    assert len(trace.kernels) == 0 and trace.memory_ops is None
    assert {"forward", "backward", "optimizer_step", "attention", "softmax"} <= set(trace.ranges["name"])


@pytest.mark.parametrize(
    "source, disguise",
    [
        (BF16, "report.txt"),
        (TORCH_TRACE, "trace.bin"),
        (FIXTURES / "nsys2022_tiny_train_bf16_gpukernsum.csv", "stats.sqlite"),
        (FIXTURES / "nsys2025_h100_tiny_train_bf16_cuda_gpu_kern_sum.txt", "stats.json.gz"),
    ],
)
def test_kind_is_read_from_content_not_name(tmp_path, source, disguise):
    copy = tmp_path / disguise
    shutil.copyfile(source, copy)
    assert per_name(load(copy)) == per_name(load(source))


def test_plain_json_trace(tmp_path):
    plain = tmp_path / "trace.json"
    plain.write_bytes(gzip.decompress(TORCH_TRACE.read_bytes()))
    assert sniff(plain) == "json"
    assert per_name(load(plain)) == per_name(load(TORCH_TRACE))


def test_other_reports_are_refused_by_name():
    with pytest.raises(ProfilerKitError, match="cuda_gpu_mem_time_sum"):
        load(FIXTURES / "nsys2025_h100_tiny_train_bf16_cuda_gpu_mem_time_sum.txt")
    with pytest.raises(ProfilerKitError, match="nvtx_kern_sum"):
        load(FIXTURES / "nsys2025_h100_tiny_train_bf16_nvtx_kern_sum.csv")
    with pytest.raises(ProfilerKitError, match="Num Calls"):
        load(FIXTURES / "nsys2022_tiny_train_bf16_cudaapisum.csv")


def test_a_report_this_nsys_cannot_open_says_how_to_export_it_where_it_was_recorded(tmp_path, monkeypatch,
                                                                                     fake_nsys):
    # What Debian's nsys 2022.4 answers for a report of nsys 2025 (a lone .nsys-rep copied to a CPU box).
    nsys = fake_nsys("echo 'Exportation error: Version not supported: 36398880' >&2; exit 1")
    monkeypatch.setenv("NSYS", str(nsys))
    report = shutil.copyfile(EXAMPLES / "small_ctx128_train_bf16.nsys-rep", tmp_path / "run.nsys-rep")
    result = CliRunner().invoke(main, ["kernels", "summarize", str(report)])
    assert result.exit_code == 1 and len(result.stderr.strip().splitlines()) == 1
    assert "`nsys export --type sqlite --output run.sqlite run.nsys-rep` where it was recorded" in result.stderr
    assert "this nsys (2025.3.1.90) cannot open it" in result.stderr
