"""A JSON object streamed in one pass gives the same items and members as parsing it whole: members before and
after the big array, taken from the file's ends (or a second pass when an end is too long), plain or gzip; and
a torch.profiler trace read that way summarizes as one read whole does."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from profiler_kit import streamed_json
from profiler_kit.errors import ProfilerKitError
from profiler_kit.files import InputLimits
from profiler_kit.kernels import load, summarize
from profiler_kit.kernels import torch_trace as torch_trace_module
from profiler_kit.streamed_json import StreamedObject

KERNELS = Path(__file__).resolve().parent / "fixtures" / "kernels"
# Members whose text holds `]`, `,` and `}` where the search for the array's end looks.
BEFORE = {"schemaVersion": 1, "deviceProperties": [{"name": "H100 [SXM]", "ids": [1, 2]}], "note": "a ], b }"}
AFTER = {"traceName": "t ], \"x\": 1}", "profiler_kit": {"phases": ["forward", "backward]"]}}


def document(items: int, before: dict, after: dict) -> dict:
    events = [{"ph": "X", "name": f"k[{i}]", "args": {"shape": [[i, 2], []]}} for i in range(items)]
    return {**before, "traceEvents": events, **after}


def write(path: Path, obj: dict) -> Path:
    text = json.dumps(obj, indent=1).encode()
    path.write_bytes(gzip.compress(text) if path.suffix == ".gz" else text)
    return path


@pytest.fixture
def second_passes(monkeypatch) -> list:
    """Ends of 200 bytes read 50 at a time, and a record of each second pass over a file."""
    monkeypatch.setattr(streamed_json, "EDGE_BYTES", 200)
    monkeypatch.setattr(streamed_json, "READ_BYTES", 50)
    calls: list = []
    original = StreamedObject._after_array
    monkeypatch.setattr(StreamedObject, "_after_array", lambda self: calls.append(self.path) or original(self))
    return calls


@pytest.mark.parametrize("name", ["t.json", "t.json.gz"])
@pytest.mark.parametrize(("before", "after"), [(BEFORE, AFTER), (BEFORE, {}), ({}, AFTER), ({}, {})])
def test_items_and_members_are_those_of_the_whole_document(tmp_path, second_passes, name, before, after):
    obj = document(50, before, after)  # its array reaches past both ends kept
    source = StreamedObject(write(tmp_path / name, obj), "traceEvents")
    assert list(source.items()) == obj["traceEvents"]
    assert source.members() == {**before, **after} and second_passes == []


def test_members_after_the_array_past_the_kept_end_come_from_a_second_pass(tmp_path, second_passes):
    long_tail = {**AFTER, "padding": ["x" * 50] * 20}
    obj = document(50, BEFORE, long_tail)
    source = StreamedObject(write(tmp_path / "t.json", obj), "traceEvents")
    assert list(source.items()) == obj["traceEvents"]
    assert source.members() == {**BEFORE, **long_tail} and second_passes == [source.path]


def test_an_object_without_the_array_is_not_a_trace(tmp_path):
    source = StreamedObject(write(tmp_path / "t.json", {"traceEvents": {"a": 1}, "other": [1]}), "traceEvents")
    assert list(source.items()) == []
    with pytest.raises(ProfilerKitError, match="not a Chrome trace"):
        source.members()


@pytest.mark.parametrize("name", ["h100_tiny_train_bf16_trace.json.gz", "cpu_ddp2_gloo.rank0.json.gz"])
def test_a_trace_streamed_reads_as_one_read_whole(monkeypatch, name):
    streamed = load(KERNELS / name)
    monkeypatch.setattr(torch_trace_module, "streamable", lambda: False)
    whole = load(KERNELS / name)
    for frame in ("kernels", "ranges", "memory_ops", "cpu_ops"):
        if getattr(whole, frame) is None:
            assert getattr(streamed, frame) is None
        else:
            pd.testing.assert_frame_equal(getattr(streamed, frame), getattr(whole, frame))
    assert (streamed.notes, streamed.clock, streamed.clock_offset_ns) == (whole.notes, whole.clock,
                                                                            whole.clock_offset_ns)
    assert summarize(KERNELS / name).to_json()["phases"]


def test_a_trace_read_whole_past_the_limit_says_it_is_not_streamed(tmp_path, monkeypatch):
    big = write(tmp_path / "t.json", document(20_000, BEFORE, AFTER))
    monkeypatch.setattr(torch_trace_module, "streamable", lambda: False)
    reader = "without the ijson package (which streams it), a torch.profiler trace is read whole"
    with pytest.raises(ProfilerKitError, match=re.escape(reader)):
        load(big, InputLimits(max_bytes=2**20))
