"""Per-rank snapshots named by a stem or a glob come in rank order, by number: rank 2 before rank 10."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from profiler_kit.memory.ranks import snapshot_paths

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "memory"
SOURCES = {10: "h100_plain_phases.pickle", 2: "h100_program_window.pickle", 1: "tiny_ctx128_train.pickle"}


@pytest.fixture
def stem(tmp_path) -> Path:
    for rank, name in SOURCES.items():
        shutil.copy(FIXTURES / name, tmp_path / f"job.rank{rank}.pickle")
    return tmp_path / "job"


def test_rank_files_of_a_stem_or_a_glob_come_by_rank_number(stem):
    expected = [stem.with_name(f"job.rank{rank}.pickle") for rank in (1, 2, 10)]
    assert snapshot_paths([stem]) == expected
    assert snapshot_paths([f"{stem}.rank*.pickle"]) == expected

