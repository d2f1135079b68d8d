"""The speed test's big report: a real export repeated end to end must summarize as exactly that many
copies of the original, kernel for kernel and phase for phase; tools/scale_bench.py times it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from profiler_kit.errors import ProfilerKitError
from profiler_kit.kernels import summarize
from profiler_kit.kernels.speedtest import build_repeated_export, reference_query

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "kernels"
BF16 = FIXTURES / "h100_tiny_train_bf16.sqlite"
TARGET = 2_000  # kernels: a few copies of the 346-kernel fixture


@pytest.fixture(scope="module")
def repeated(tmp_path_factory) -> tuple[Path, int]:
    big = tmp_path_factory.mktemp("speed") / "big.sqlite"
    return big, build_repeated_export(BF16, big, TARGET)


def test_copies_hold_at_least_the_target(repeated):
    big, copies = repeated
    one = summarize(BF16)
    assert copies == -(-TARGET // one.kernel_count)
    assert summarize(big).kernel_count == copies * one.kernel_count >= TARGET


def test_every_copy_keeps_its_launches_and_phases(repeated):
    big, copies = repeated
    one, many = summarize(BF16), summarize(big)
    assert many.category_ns() == {c: copies * ns for c, ns in one.category_ns().items()}
    assert many.phase_ns() == {
        phase: {
            "total_ns": copies * p["total_ns"],
            "categories": {c: copies * ns for c, ns in p["categories"].items()},
        }
        for phase, p in one.phase_ns().items()
    }
    assert many.memory_ops_ns == copies * one.memory_ops_ns
    inside = summarize(big, nvtx="softmax")
    assert inside.total_ns == copies * summarize(BF16, nvtx="softmax").total_ns


def test_reference_query_groups_every_kernel_by_name(repeated):
    big, copies = repeated
    with sqlite3.connect(big) as con:
        rows = con.execute(reference_query(big)).fetchall()
    by_name = summarize(big).kernels.set_index("name")
    assert {name: (count, total) for name, count, total, _ in rows} == {
        name: (int(row.instances), int(row.total_ns)) for name, row in by_name.iterrows()
    }


def test_only_an_sqlite_export_can_be_repeated(tmp_path):
    with pytest.raises(ProfilerKitError, match="not an SQLite file"):
        build_repeated_export(FIXTURES / "nsys2022_tiny_train_bf16_gpukernsum.csv", tmp_path / "x.sqlite")
    with pytest.raises(ProfilerKitError, match="no kernels"):
        build_repeated_export(FIXTURES / "cpu_tiny_train_nsys2022.sqlite", tmp_path / "x.sqlite")
