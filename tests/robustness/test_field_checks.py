"""Every field a reader reads is checked as it is read: a cell or field of the wrong type is one `Error:` line
naming the file and the field (exit 1), never an internal error; sums that could pass 2^63 are refused; files
cut short are said; SQLite exports are read without touching them."""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import pickle
import shutil
import sqlite3
import sys
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from profiler_kit.attention import bench
from profiler_kit.cli import main
from profiler_kit.errors import ProfilerKitError
from profiler_kit.kernels import load
from profiler_kit.kernels.ranks import rank_traces

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
KERNELS = FIXTURES / "kernels"
H100 = KERNELS / "h100_tiny_train_bf16.sqlite"
TRACE = KERNELS / "h100_tiny_train_bf16_trace.json.gz"
STATS_CSV = KERNELS / "nsys2025_h100_tiny_train_bf16_cuda_gpu_kern_sum.csv"
SNAPSHOT = FIXTURES / "memory" / "tiny_ctx128_train.pickle"
SIDECAR = FIXTURES / "memory" / "tiny_ctx128_train.json"
KERNEL, RUNTIME, NVTX = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS"
FIRST_RANGE = f"rowid = (SELECT min(rowid) FROM {NVTX} WHERE eventType = 59)"


def export(tmp_path: Path, *sql: str) -> Path:
    """A copy of the H100 export with its kernel, runtime and NVTX tables rebuilt without constraints (so any
    cell can hold any type), then `sql` run on it."""
    path = shutil.copyfile(H100, tmp_path / "k.sqlite")
    con = sqlite3.connect(path)
    for table in (KERNEL, RUNTIME, NVTX):
        con.executescript(f"CREATE TABLE t AS SELECT * FROM {table}; DROP TABLE {table}; "
                          f"ALTER TABLE t RENAME TO {table};")
    for statement in sql:
        con.execute(statement)
    con.commit()
    con.close()
    return path


def trace(tmp_path: Path, edit) -> Path:
    """A copy of the H100 torch.profiler trace with `edit(events)` applied."""
    obj = json.loads(gzip.decompress(TRACE.read_bytes()))
    edit(obj["traceEvents"])
    path = tmp_path / "t.json"
    path.write_text(json.dumps(obj))
    return path


def first(events: list[dict], cat: str) -> dict:
    return next(e for e in events if e.get("cat") == cat and e.get("ph") == "X")


def stats(tmp_path: Path, edit, name: str = "k.csv") -> Path:
    path = tmp_path / name
    path.write_text(edit(STATS_CSV.read_text()))
    return path


def stats_cells(tmp_path: Path, edit) -> Path:
    """The `nsys stats` CSV with `edit(rows)` applied to its cells (header first)."""
    preamble, body = STATS_CSV.read_text().split("\n", 1)
    rows = [row for row in csv.reader(io.StringIO(body)) if row]
    edit(rows)
    out = io.StringIO()
    csv.writer(out).writerows(rows)
    path = tmp_path / "k.csv"
    path.write_text(preamble + "\n" + out.getvalue())
    return path


def snapshot(tmp_path: Path, edit, metadata: dict | None = None) -> Path:
    """A copy of the tiny snapshot with `edit(obj)` applied; with `metadata`, that as its sidecar."""
    obj = pickle.loads(SNAPSHOT.read_bytes())
    edit(obj)
    path = tmp_path / "s.pickle"
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)  # pickling a deeply nested field
    try:
        path.write_bytes(pickle.dumps(obj, protocol=4))
    finally:
        sys.setrecursionlimit(limit)
    if metadata is not None:
        path.with_suffix(".json").write_text(json.dumps(metadata))
    return path


def first_alloc(obj: dict) -> dict:
    return next(e for t in obj["device_traces"] for e in t if e["action"] == "alloc" and e.get("frames"))


def metadata(**fields) -> dict:
    return {**json.loads(SIDECAR.read_text()), **fields}


def one_error(args: list) -> str:
    result = CliRunner().invoke(main, [str(a) for a in args])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1, result.stderr
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    return lines[0]


# reader → (how to make the input with one wrong-typed field, the command, phrases the error must hold)
WRONG_FIELD = {
    "sqlite export": (lambda tmp: export(tmp, f"UPDATE {KERNEL} SET correlationId = 'abc' WHERE rowid = 1"),
                      "kernels", (f"{KERNEL}.correlationId", "text 'abc'")),
    "torch trace": (lambda tmp: trace(tmp, lambda ev: first(ev, "user_annotation").update(tid="main")),
                    "kernels", ("tid", "'main'")),
    "nsys stats csv": (lambda tmp: stats_cells(tmp, lambda rows: rows[1].__setitem__(2, "many")),
                       "kernels", ("Instances", "'many'")),
    "snapshot": (lambda tmp: snapshot(tmp, lambda o: first_alloc(o)["frames"][0].update(name=7)),
                 "memory", ("['frames'][0]['name'] is a int",)),
    "embedded metadata": (lambda tmp: snapshot(tmp, lambda o: o.update(profiler_kit=metadata(tensor_roles=[1]))),
                          "memory", ("'profiler_kit' entry", "['tensor_roles'] is a list")),
}


@pytest.mark.parametrize("reader", list(WRONG_FIELD))
def test_every_reader_refuses_a_wrong_typed_field_in_one_line(tmp_path, reader):
    make, command, phrases = WRONG_FIELD[reader]
    path = make(tmp_path)
    line = one_error([command, "summarize", path])
    assert str(tmp_path) in line and all(phrase in line for phrase in phrases), line


def test_a_sidecar_of_the_right_version_but_the_wrong_shape_is_ignored_with_a_note(tmp_path):
    path = snapshot(tmp_path, lambda o: None, metadata(phases="forward"))
    result = CliRunner().invoke(main, ["memory", "summarize", str(path), "--format", "json"])
    assert result.exit_code == 0, result.stderr
    assert ("s.json beside the snapshot is ignored: it has the wrong shape: the metadata['phases'] is a str, "
            "expected a list") in json.loads(result.stdout)["notes"]


@pytest.mark.parametrize(("sql", "field"), [
    (f"UPDATE {KERNEL} SET demangledName = NULL WHERE rowid = 5", f"{KERNEL}.demangledName of row 5 holds NULL"),
    (f"UPDATE {KERNEL} SET demangledName = x'00ff' WHERE rowid = 5", "demangledName of row 5 holds blob X'00FF'"),
    (f"UPDATE {KERNEL} SET demangledName = 1.5 WHERE rowid = 5", "demangledName of row 5 holds real 1.5"),
    (f"UPDATE {KERNEL} SET streamId = 'x' WHERE rowid = 2", f"{KERNEL}.streamId of row 2 holds text"),
    (f"UPDATE {KERNEL} SET globalPid = 'x' WHERE rowid = 2", f"{KERNEL}.globalPid"),
    (f"UPDATE {RUNTIME} SET correlationId = 'x' WHERE rowid = 3", f"{RUNTIME}.correlationId of row 3"),
    (f"UPDATE {RUNTIME} SET globalTid = 'x' WHERE rowid = 3", f"{RUNTIME}.globalTid"),
    (f"UPDATE {NVTX} SET globalTid = 'x' WHERE {FIRST_RANGE}", f"{NVTX}.globalTid"),
    (f"UPDATE {NVTX} SET eventType = 'push' WHERE rowid = 1", f"{NVTX}.eventType"),
    (f"UPDATE {NVTX} SET text = x'41' WHERE rowid = 1", f"{NVTX}.text"),
    ("UPDATE StringIds SET value = x'00' WHERE id = (SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL)",
     "StringIds.value"),
])
def test_an_export_cell_of_a_type_nsys_never_writes_is_an_error_naming_it(tmp_path, sql, field):
    path = export(tmp_path, sql)
    with pytest.raises(ProfilerKitError, match=f"^{path}: ") as info:
        load(path)
    assert field in str(info.value)


def test_a_kernel_named_by_text_among_string_ids_keeps_both_kinds_of_name(tmp_path):
    names = set(load(H100).kernels["name"].astype(str))
    kernels = load(export(tmp_path, f"UPDATE {KERNEL} SET demangledName = 'my_kernel' WHERE rowid = 1")).kernels
    found = set(kernels["name"].astype(str))
    assert "my_kernel" in found and found - {"my_kernel"} <= names and len(found) > 10


def test_times_that_overflow_int64_are_skipped_with_a_note(tmp_path):
    whole = load(H100)
    edited = load(export(tmp_path, f"UPDATE {KERNEL} SET start = -9223372036854775808, end = 9223372036854775807 "
                                   "WHERE rowid = 1"))
    assert len(edited.kernels) == len(whole.kernels) - 1
    assert (edited.kernels["total_ns"] >= 0).all()
    assert any(note.startswith("skipped 1 of 346 kernels") for note in edited.notes)


def test_huge_correlation_ids_match_without_warnings(tmp_path):
    path = export(tmp_path, f"UPDATE {KERNEL} SET correlationId = 9223372036854775807 WHERE rowid = 1",
                  f"UPDATE {RUNTIME} SET correlationId = 9223372036854775807 WHERE rowid = 1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kernels = load(path).kernels
    assert (kernels["launch_ns"] >= 0).sum() == (load(H100).kernels["launch_ns"] >= 0).sum() - 1


def test_ranges_never_closed_get_a_note(tmp_path):
    edited = load(export(tmp_path, f"UPDATE {NVTX} SET end = NULL WHERE {FIRST_RANGE}"))
    assert any("1 of 15 NVTX ranges were never closed" in note for note in edited.notes)
    assert not any("never closed" in note for note in load(H100).notes)


@pytest.mark.parametrize("make", [
    lambda tmp: export(tmp, f"UPDATE {KERNEL} SET start = 0, end = 4000000000000000000"),
    lambda tmp: trace(tmp, lambda ev: [e.update(dur=4e15) for e in ev if e.get("cat") == "kernel"]),
    lambda tmp: stats_cells(tmp, lambda rows: [row.__setitem__(1, "4000000000000000000") for row in rows[1:]]),
], ids=["sqlite", "torch trace", "nsys stats"])
def test_durations_that_add_up_past_int64_are_refused(tmp_path, make):
    with pytest.raises(ProfilerKitError, match="add up to more than 2\\^62 ns"):
        load(make(tmp_path))


def test_snapshot_sizes_that_add_up_past_int64_are_refused(tmp_path):
    def huge(obj):
        obj["segments"] = []
        obj["device_traces"] = [[{"action": "alloc", "addr": 4096 * (i + 1), "size": 4 * 10**18, "frames": []}
                                 for i in range(3)]]
    line = one_error(["memory", "summarize", snapshot(tmp_path, huge)])
    assert "12,000,000,000,000,000,000 bytes, past 2^63" in line


@pytest.mark.parametrize(("value", "phrase"), [(float("nan"), "is nan"), (float("inf"), "is inf"),
                                               (1e300, "is 1e+300"), ("x", "is a str")])
def test_snapshot_times_that_are_not_finite_numbers_are_refused(tmp_path, value, phrase):
    line = one_error(["memory", "summarize", snapshot(tmp_path, lambda o: first_alloc(o).update(time_us=value))])
    assert f"['time_us'] {phrase}" in line


def deep(levels: int) -> list:
    value: list = []
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(("frame", "phrase"), [
    ({"filename": "train.py", "line": 3}, "has no 'name'"),
    ({"name": deep(5000), "filename": "train.py", "line": 3}, "['name'] is a list"),
])
def test_snapshot_frames_without_a_name_or_with_nested_fields_are_refused(tmp_path, frame, phrase):
    line = one_error(["memory", "summarize", snapshot(tmp_path, lambda o: first_alloc(o).update(frames=[frame]))])
    assert phrase in line


def test_a_csv_cut_inside_a_quoted_name_is_said(tmp_path):
    path = stats(tmp_path, lambda text: text[: text.index('"', len(text) // 2) + 10])
    with pytest.raises(ProfilerKitError, match="ends inside a quoted cell at its line .*cut short"):
        load(path)


def test_a_csv_whose_last_row_is_short_is_said(tmp_path):
    def cut(text: str) -> str:
        *rows, last = text.rstrip("\n").split("\n")
        return "\n".join([*rows, ",".join(last.split(",")[:6])]) + "\n"

    path = stats(tmp_path, cut)
    with pytest.raises(ProfilerKitError, match="last row .* has 6 of its header's 9 cells: the file is cut short"):
        load(path)


@pytest.mark.parametrize("edit", [
    lambda text: "\ufeff" + text,
    lambda text: text.replace("Time (%)", "\ufeffTime (%)", 1),
    lambda text: "\ufeff" + text.replace("Time (%)", "\ufeff\ufeffTime (%)", 1),
], ids=["file start", "before the header", "both"])
def test_byte_order_marks_before_the_header_are_read(tmp_path, edit):
    assert load(stats(tmp_path, edit)).kernels.equals(load(STATS_CSV).kernels)


def test_a_table_named_with_a_quote_leaves_an_export_readable(tmp_path):
    path = export(tmp_path, 'CREATE TABLE "we""ird" (a)')
    assert load(path).kernels.equals(load(H100).kernels)


def test_a_wal_export_in_a_read_only_folder_is_read_without_side_files(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    path = shutil.copyfile(H100, folder / "k.sqlite")
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA journal_mode = WAL").fetchone() == ("wal",)
    con.close()
    mtime = path.stat().st_mtime_ns
    os.chmod(folder, 0o555)
    try:
        assert load(path).kernels.equals(load(H100).kernels)
    finally:
        os.chmod(folder, 0o755)
    assert sorted(p.name for p in folder.iterdir()) == ["k.sqlite"] and path.stat().st_mtime_ns == mtime


def test_two_reports_of_one_rank_are_refused(tmp_path):
    a = shutil.copyfile(KERNELS / "cpu_ddp2_gloo.rank0.json.gz", tmp_path / "a.rank0.json.gz")
    b = shutil.copyfile(KERNELS / "cpu_ddp2_gloo.rank1.json.gz", tmp_path / "b.rank0.json.gz")
    with pytest.raises(ProfilerKitError, match="a.rank0.json.gz and .*b.rank0.json.gz are both rank 0"):
        rank_traces([a, b])


@pytest.mark.parametrize(("edit", "phrase"), [
    (lambda ev: first(ev, "kernel")["args"].update(correlation=10**30), "args.correlation"),
    (lambda ev: first(ev, "cuda_runtime").update(pid=1e300), "has pid"),
    (lambda ev: first(ev, "kernel").update(args=[1, 2]), "has args '[1, 2]'; torch.profiler writes a dict"),
])
def test_trace_ids_outside_what_torch_writes_are_refused(tmp_path, edit, phrase):
    with pytest.raises(ProfilerKitError, match="torch.profiler writes") as info:
        load(trace(tmp_path, edit))
    assert phrase in str(info.value)


def test_absurd_attention_bench_settings_are_refused_before_any_work():
    with pytest.raises(ProfilerKitError, match="measured time of 1e\\+15 ms"):
        bench.settings(bench.resolve_device("cpu"), 25, 1e15)
    with pytest.raises(ProfilerKitError, match="inputs alone take"):
        bench.AttentionConfig("naive", "fp32", True, 8, None, 10**12, 16)


def test_an_unbalanced_quote_in_nsys_args_is_a_usage_error():
    result = CliRunner().invoke(main, ["nsys", "--backend", "torch", "--nsys-args", "--trace 'cuda", "--", "true"])
    assert result.exit_code == 2 and "No closing quotation" in result.stderr, result.stderr


def test_a_phase_list_that_is_not_names_is_noted_and_its_names_kept(tmp_path):
    with gzip.open(FIXTURES / "kernels" / "cpu_tiny_train_torch.json.gz", "rt") as fh:
        trace = json.load(fh)
    trace["profiler_kit"] = {"phases": ["forward", 7, None]}
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(trace))
    loaded = load(path)
    assert any("profiler_kit.phases is not a list of names" in note for note in loaded.notes)
    marked = loaded.ranges[loaded.ranges["marked"]]
    assert set(marked["name"]) <= {"forward"}


def test_a_bad_frame_in_a_stack_like_one_already_checked_is_refused(tmp_path):
    """Stacks whose frames were all found well-formed are not checked again; one that shares its first frame
    and length with them but holds another frame is."""

    def edit(obj):
        allocs = [e for t in obj["device_traces"] for e in t if e["action"] == "alloc" and len(e.get("frames")) > 2]
        first, later = allocs[0], allocs[-1]
        bad = dict(first["frames"][1], line="3")
        later["frames"] = [first["frames"][0], bad, *first["frames"][2:]]
        return obj

    line = one_error(["memory", "summarize", snapshot(tmp_path, edit)])
    assert "['frames'][1]['line'] is a str" in line
