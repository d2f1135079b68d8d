"""Loading snapshots safely: valid ones load; missing, empty, truncated, random and non-snapshot pickles, and
pickles that name a global, give one-line errors (nothing they name is imported or run); the recorder's metadata,
from its sidecar or from inside the snapshot."""

import json
import os
import pickle
import random

import pytest
from click.testing import CliRunner

from profiler_kit.cli import main
from profiler_kit.errors import ProfilerKitError
from profiler_kit.memory import load_sidecar, load_snapshot
from profiler_kit.memory.snapshot import EMBEDDED_KEY, SIDECAR_FORMAT, SIDECAR_VERSION, load_metadata

FRAME = {"filename": "/work/main/profiler_kit/model.py", "line": 33, "name": "naive_causal_attention"}
SNAPSHOT = {
    "segments": [{
        "device": 0, "address": 1 << 40, "total_size": 2 << 20, "allocated_size": 1024, "active_size": 1024,
        "requested_size": 1000, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
        "is_expandable": False, "frames": [],
        "blocks": [
            {"address": 1 << 40, "size": 1024, "requested_size": 1000, "state": "active_allocated",
             "frames": [FRAME]},
            {"address": (1 << 40) + 1024, "size": (2 << 20) - 1024, "requested_size": 0, "state": "inactive",
             "frames": []},
        ],
    }],
    "device_traces": [[
        {"action": "segment_alloc", "addr": 1 << 40, "size": 2 << 20, "stream": 0, "time_us": 1,
         "frames": []},
        {"action": "alloc", "addr": 1 << 40, "size": 1000, "stream": 0, "time_us": 2, "frames": [FRAME]},
        {"action": "snapshot", "addr": 0, "size": 1000, "stream": 0, "time_us": 3},
    ]],
    "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "roundup_power2_divisions": {"1": 0}},
}


class Exploit:
    """Unpickling this would run a shell command that creates a file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def write(tmp_path, data: bytes, name="snap.pickle"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("protocol", [2, 4, pickle.HIGHEST_PROTOCOL])
def test_valid_snapshot_loads_whatever_the_protocol(tmp_path, protocol):
    with_set = dict(SNAPSHOT, extra={"a", "b"})  # protocol 2 spells sets through builtins.set
    assert load_snapshot(write(tmp_path, pickle.dumps(with_set, protocol=protocol))) == with_set


@pytest.mark.parametrize("make, message", [
    (lambda: b"", "the file is empty"),
    (lambda: pickle.dumps(SNAPSHOT, protocol=4)[:200], "truncated"),
    (lambda: b"PK\x03\x04 not a pickle at all", "not a pickle"),
    (lambda: pickle.dumps([1, 2, 3]), "the pickle holds a list"),
    (lambda: pickle.dumps({"segments": []}), "not 'segments'/'device_traces'"),
    (lambda: pickle.dumps(dict(SNAPSHOT, segments=[{"address": 1, "blocks": []}])), "has no 'total_size'"),
    (lambda: pickle.dumps(dict(SNAPSHOT, device_traces=[[{"action": "alloc", "size": 4}]])), "has no 'addr'"),
    (lambda: pickle.dumps(dict(SNAPSHOT, device_traces=[{"x": 1}])), "expected a list"),
])
def test_bad_files_give_a_clear_error(tmp_path, make, message):
    with pytest.raises(ProfilerKitError, match=message) as info:
        load_snapshot(write(tmp_path, make()))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("seed", range(20))
def test_random_bytes_give_a_clear_error(tmp_path, seed):
    with pytest.raises(ProfilerKitError, match="cannot read memory snapshot") as info:
        load_snapshot(write(tmp_path, random.Random(seed).randbytes(4096)))
    assert "\n" not in str(info.value)


def test_globals_are_refused_before_anything_runs(tmp_path):
    marker = tmp_path / "pwned"
    path = write(tmp_path, pickle.dumps({"segments": [], "device_traces": [], "x": Exploit(marker)}))
    with pytest.raises(ProfilerKitError, match=r"names posix\.system.*refused"):
        load_snapshot(path)
    assert not marker.exists()


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(ProfilerKitError, match="no such snapshot file"):
        load_snapshot(tmp_path / "nope.pickle")
    with pytest.raises(ProfilerKitError, match="is a directory"):
        load_snapshot(tmp_path)


@pytest.mark.parametrize("content", [b"", b"\x80\x04garbage", pickle.dumps(["not", "a", "snapshot"])])
def test_cli_error_is_one_line_without_traceback(tmp_path, content):
    path = write(tmp_path, content)
    result = CliRunner().invoke(main, ["memory", "summarize", str(path)])
    assert result.exit_code == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: cannot read memory snapshot")
    assert "Traceback" not in result.output


def test_sidecar_is_optional_and_checked(tmp_path):
    path = write(tmp_path, pickle.dumps(SNAPSHOT))
    assert load_sidecar(path) == (None, None)
    side = tmp_path / "snap.json"
    side.write_text(json.dumps({"format": SIDECAR_FORMAT, "version": SIDECAR_VERSION, "phases": []}))
    assert load_sidecar(path) == ({"format": SIDECAR_FORMAT, "version": SIDECAR_VERSION, "phases": []}, None)


@pytest.mark.parametrize("content, reason", [
    (b"", "it is empty"),
    (b"  \n", "it is empty"),
    (b"{broken", "snap.json: not valid JSON (line 1"),
    (b"\xff\xfe\x00binary", "snap.json: not JSON text (binary data)"),
    (b'{"something": "else"}', "it is not profiler-kit memory metadata"),
    (b"null", "it is not profiler-kit memory metadata"),
    # What `memory summarize --format json > snap.json` writes: a report, not the recorder's metadata.
    (json.dumps({"schema_version": 1, "snapshot": "snap.pickle", "peak": {}}).encode(),
     "it is not profiler-kit memory metadata"),
    (json.dumps({"format": SIDECAR_FORMAT, "version": SIDECAR_VERSION + 1}).encode(),
     f"it is version {SIDECAR_VERSION + 1} of profiler-kit memory metadata; this tool reads {SIDECAR_VERSION}"),
])
def test_a_json_beside_the_snapshot_that_is_not_the_recorders_is_ignored_with_a_note(tmp_path, content, reason):
    path = write(tmp_path, pickle.dumps(SNAPSHOT))
    (tmp_path / "snap.json").write_bytes(content)
    sidecar, note = load_sidecar(path)
    assert sidecar is None and note.startswith("snap.json beside the snapshot is ignored: ") and reason in note
    assert "\n" not in note
    # The run goes on as if there were none, and says why.
    result = CliRunner().invoke(main, ["memory", "summarize", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["metadata_source"] is None and data["notes"][0] == note


def test_an_unreadable_sidecar_is_ignored_with_a_note(tmp_path):
    path = write(tmp_path, pickle.dumps(SNAPSHOT))
    (tmp_path / "snap.json").mkdir()  # not a regular file
    sidecar, note = load_sidecar(path)
    assert sidecar is None and note.startswith("snap.json beside the snapshot is ignored: ")
    (tmp_path / "snap.json").rmdir()
    (tmp_path / "snap.json").symlink_to(tmp_path / "nowhere.json")  # a dangling link
    assert load_sidecar(path)[0] is None and load_sidecar(path)[1].startswith("snap.json beside the snapshot")


def test_an_ignored_sidecar_leaves_the_metadata_inside_the_snapshot_in_charge(tmp_path):
    meta = {"format": SIDECAR_FORMAT, "version": SIDECAR_VERSION, "phases": [], "where": "inside"}
    path = write(tmp_path, pickle.dumps(dict(SNAPSHOT, **{EMBEDDED_KEY: meta})))
    (tmp_path / "snap.json").write_text("")
    found, source, note = load_metadata(path, load_snapshot(path))
    assert (found, source) == (meta, "snapshot") and note == "snap.json beside the snapshot is ignored: it is empty"


def test_metadata_comes_from_the_sidecar_else_from_the_snapshot(tmp_path):
    meta = {"format": SIDECAR_FORMAT, "version": SIDECAR_VERSION, "phases": [], "where": "inside"}
    path = write(tmp_path, pickle.dumps(dict(SNAPSHOT, **{EMBEDDED_KEY: meta})))
    snapshot = load_snapshot(path)
    assert load_metadata(path, snapshot) == (meta, "snapshot", None)
    (tmp_path / "snap.json").write_text(json.dumps(dict(meta, where="beside")))
    assert load_metadata(path, snapshot)[0]["where"] == "beside"
    assert load_metadata(path, snapshot, use_sidecar=False) == (meta, "snapshot", None)
    assert load_metadata(path, SNAPSHOT, use_sidecar=False) == (None, None, None)
    with pytest.raises(ProfilerKitError, match="is not profiler-kit memory metadata; it was not written by"):
        load_metadata(path, dict(SNAPSHOT, **{EMBEDDED_KEY: {"x": 1}}), use_sidecar=False)


def test_a_file_that_is_not_a_pickle_says_what_was_expected(tmp_path):
    """An nsys export, a torch.profiler trace, JSON: one line naming what the file is and what summarize reads."""
    import gzip
    import sqlite3

    database = tmp_path / "run.sqlite"
    with sqlite3.connect(database) as connection:
        connection.execute("CREATE TABLE StringIds (id INTEGER, value TEXT)")
    (tmp_path / "trace.json.gz").write_bytes(gzip.compress(b'{"traceEvents": []}'))
    (tmp_path / "report.json").write_text('{"snapshot": "x"}\n')
    expected = ("expected a CUDA memory snapshot pickle (from torch.cuda.memory._dump_snapshot or profiler-kit "
                "memory)")
    for name, kind in (("run.sqlite", "an SQLite database (e.g. an nsys export)"), ("trace.json.gz", "gzip data"),
                       ("report.json", "JSON")):
        result = CliRunner().invoke(main, ["memory", "summarize", str(tmp_path / name)])
        assert result.exit_code == 1 and result.stdout == ""
        assert result.stderr == (f"Error: cannot read memory snapshot {tmp_path / name}: it is {kind}, not a "
                                 f"pickle; {expected}\n")
