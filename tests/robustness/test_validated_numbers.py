"""No number a source does not give: times and counts that are text, non-finite or negative are errors, or
skipped rows named in a note; malformed tables are one-line errors naming the file."""

from __future__ import annotations

import csv
import gzip
import io
import json
import shutil
import sqlite3
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from profiler_kit.cli import main
from profiler_kit.errors import ProfilerKitError
from profiler_kit.kernels import load, summarize

KERNELS = Path(__file__).resolve().parents[1] / "fixtures" / "kernels"
STATS_CSV = KERNELS / "nsys2025_h100_tiny_train_bf16_cuda_gpu_kern_sum.csv"
PIPES = KERNELS / "nsys2022_tiny_train_bf16_gpukernsum_table.txt"
H100 = KERNELS / "h100_tiny_train_bf16.sqlite"
TRACE = KERNELS / "h100_tiny_train_bf16_trace.json.gz"


def stats_rows() -> tuple[str, list[list[str]]]:
    """The preamble line and the cells of a real `nsys stats --format csv` output."""
    preamble, body = STATS_CSV.read_text().split("\n", 1)
    return preamble, [row for row in csv.reader(io.StringIO(body)) if row]


def write_stats(path: Path, preamble: str, rows: list[list[str]]) -> Path:
    out = io.StringIO()
    csv.writer(out).writerows(rows)
    path.write_text(preamble + "\n" + out.getvalue())
    return path


@pytest.mark.parametrize(("column", "value", "phrase"), [
    ("Total Time (ns)", "inf", "'inf'"),
    ("Total Time (ns)", "-5000", "'-5000'"),
    ("Total Time (ns)", "fast", "'fast'"),
    ("Total Time (ns)", "1e30", "too large"),
    ("Instances", "-3", "'-3'"),
    ("Instances", "2.5", "'2.5'"),
    ("Instances", "nan", "'nan'"),
])
def test_stats_cells_that_are_not_times_or_counts_are_errors(tmp_path, column, value, phrase):
    preamble, rows = stats_rows()
    rows[2][rows[0].index(column)] = value
    path = write_stats(tmp_path / "k.csv", preamble, rows)
    with pytest.raises(ProfilerKitError, match=f"^{path}: .*{phrase}"):
        load(path)


def test_a_duplicated_column_is_an_error(tmp_path):
    preamble, rows = stats_rows()
    rows = [row + [row[rows[0].index("Name")]] for row in rows]
    with pytest.raises(ProfilerKitError, match="column 'Name' twice"):
        load(write_stats(tmp_path / "k.csv", preamble, rows))


def test_a_ragged_text_table_is_an_error(tmp_path):
    lines = PIPES.read_text().splitlines()
    first_row = next(i for i, line in enumerate(lines) if line.lstrip().startswith("|") and i > 3)
    lines[first_row] += " extra |"
    path = tmp_path / "k.txt"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ProfilerKitError, match="different number of cells"):
        load(path)


def edited_export(tmp_path: Path, sql: str) -> Path:
    """The H100 export with its kernel and NVTX tables rebuilt without NOT NULL constraints, then `sql` run."""
    path = shutil.copyfile(H100, tmp_path / "k.sqlite")
    con = sqlite3.connect(path)
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "NVTX_EVENTS"):
        con.executescript(f"CREATE TABLE t AS SELECT * FROM {table}; DROP TABLE {table}; "
                          f"ALTER TABLE t RENAME TO {table};")
    con.executescript(sql)
    con.commit()
    con.close()
    return path


def test_kernels_without_usable_times_are_skipped_and_named(tmp_path):
    whole = summarize(H100)
    path = edited_export(tmp_path, "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = NULL WHERE rowid % 3 = 0;")
    con = sqlite3.connect(path)
    kept_ns, bad = con.execute("SELECT sum(end - start), sum(end IS NULL) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    trace = load(path)
    assert trace.kernels["total_ns"].sum() == kept_ns < whole.total_ns
    assert (trace.kernels["total_ns"] >= 0).all()
    assert any(f"skipped {bad:,} of" in note for note in trace.notes)


@pytest.mark.parametrize("sql", [
    "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'abc', end = 'def';",
    "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = start - 100;",
])
def test_a_kernel_table_without_any_usable_time_is_an_error(tmp_path, sql):
    with pytest.raises(ProfilerKitError, match="none of the 346 rows"):
        load(edited_export(tmp_path, sql))


def test_nvtx_table_missing_columns_is_an_error(tmp_path):
    path = edited_export(tmp_path, "ALTER TABLE NVTX_EVENTS DROP COLUMN eventType;")
    with pytest.raises(ProfilerKitError, match=f"^{path}: table NVTX_EVENTS has no eventType column"):
        load(path)


def test_ranges_without_a_start_are_skipped_and_without_an_end_last_to_the_end(tmp_path):
    path = edited_export(tmp_path, "UPDATE NVTX_EVENTS SET start = NULL WHERE rowid = 1; "
                                   "UPDATE NVTX_EVENTS SET end = NULL;")
    trace = load(path)
    assert len(trace.ranges) and (trace.ranges["end_ns"] >= trace.ranges["start_ns"]).all()
    assert any("NVTX ranges without a usable start" in note for note in trace.notes)


def edited_trace(tmp_path: Path, edit) -> Path:
    obj = json.loads(gzip.decompress(TRACE.read_bytes()))
    kernels = [e for e in obj["traceEvents"] if e.get("cat") == "kernel"]
    edit(kernels)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(obj))
    return path


def test_trace_events_without_name_or_duration_are_skipped_and_counted(tmp_path):
    def edit(kernels):
        for e in kernels[:5]:
            del e["dur"]
        for e in kernels[5:10]:
            del e["name"]
        for e in kernels[10:15]:
            e["dur"] = "abc"
        for e in kernels[15:20]:
            e["dur"] = -4

    path = edited_trace(tmp_path, edit)
    trace = load(path)
    assert len(trace.kernels) == len(load(TRACE).kernels) - 20
    assert (trace.kernels["total_ns"] >= 0).all()
    assert any("skipped 20 of" in note for note in trace.notes)


def test_a_trace_whose_kernels_all_lack_a_duration_is_an_error(tmp_path):
    def edit(kernels):
        for e in kernels:
            e["dur"] = 1e400  # written as Infinity

    with pytest.raises(ProfilerKitError, match="none of the 346 kernel events"):
        load(edited_trace(tmp_path, edit))


def test_cpu_operators_without_usable_times_are_skipped_and_counted(tmp_path):
    obj = json.loads(gzip.decompress((KERNELS / "cpu_example_mlp_torch.json.gz").read_bytes()))
    ops = [e for e in obj["traceEvents"] if e.get("cat") == "cpu_op"]
    for e in ops[:3]:
        e["dur"] = -1
    for e in ops[3:6]:
        e["ts"] = "later"
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(obj))
    trace = load(path)
    assert len(trace.cpu_ops) == len(load(KERNELS / "cpu_example_mlp_torch.json.gz").cpu_ops) - 6
    assert (trace.cpu_ops["total_ns"] >= 0).all()
    assert any(note.startswith(f"skipped 6 of {len(ops):,} CPU operator events") for note in trace.notes)


# (A, B): two single reports (one run each), and two reports of two steps each (medians over the steps).
COMPARED = [("h100_tiny_train_bf16.sqlite", "h100_tiny_train_fp32.sqlite"),
            ("h100_example_mlp.sqlite", "h100_ddp1_nsys.sqlite")]


@pytest.mark.parametrize(("a", "b"), COMPARED)
def test_compare_kernel_rows_add_up_to_the_total_delta_in_json_and_csv(tmp_path, a, b):
    reports = [str(KERNELS / a), str(KERNELS / b)]
    doc = json.loads(CliRunner().invoke(main, ["kernels", "compare", *reports, "--format", "json"]).stdout)
    total = next(row for row in doc["categories"] if row["category"] == "total")
    rows = doc["kernels"]
    assert len(rows) > len(doc["top_kernels"]) >= 1
    assert sum(r["a_ns"] for r in rows) == total["a_ns"] and sum(r["b_ns"] for r in rows) == total["b_ns"]
    assert sum(r["delta_ns"] for r in rows) == total["delta_ns"]
    csv_dir = tmp_path / "tables"
    done = CliRunner().invoke(main, ["kernels", "compare", *reports, "--format", "csv", "--csv-dir", str(csv_dir)])
    assert done.exit_code == 0, done.output
    tables = {path.name: pd.read_csv(path) for path in csv_dir.glob("*.csv")}
    kernels = next(t for t in tables.values() if "kernel" in t and t["kernel"].str.contains("other kernels").any())
    categories = next(t for t in tables.values() if "category" in t and (t["category"] == "total").any())
    moved = categories.loc[categories["category"] == "total", "delta_ms"].item()
    assert kernels["delta_ms"].sum() == pytest.approx(moved, abs=1e-9)
    assert len(kernels) < len(rows)  # the movers and one row for the rest
