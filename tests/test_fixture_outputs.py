"""The report commands give, on every committed fixture report, exactly the outputs stored under
tests/fixtures/outputs/ (tools/fixture_outputs.py runs the commands and, with --write, stores them)."""

import importlib.util
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "fixture_outputs.py"
_spec = importlib.util.spec_from_file_location("fixture_outputs", TOOL)
outputs = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = outputs  # dataclasses look their module up there
_spec.loader.exec_module(outputs)
CASES = outputs.cases()


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_output_is_the_stored_one(case):
    fresh = outputs.output(case)
    stored = outputs.stored(case)
    assert stored is not None, f"no stored output for {case.name}: `python tools/fixture_outputs.py --write`"
    assert fresh == stored, (f"{case.name} differs from {case.path.name} (after an intended change: "
                             f"`python tools/fixture_outputs.py --write`):\n{outputs.difference(case, fresh)}")


def test_every_stored_output_has_its_case():
    kept = {case.path.name for case in CASES}
    assert sorted(p.name for p in outputs.OUTPUTS.iterdir() if p.name not in kept) == []


def test_every_fixture_report_and_snapshot_has_a_case():
    named = {arg for case in CASES for arg in case.args}
    fixtures = [p for p in (outputs.REPO / "tests" / "fixtures" / "kernels").iterdir()
                if p.suffix in (".sqlite", ".gz", ".csv", ".txt")]
    reports = [str(p.relative_to(outputs.REPO)) for p in fixtures
               if not any(kind in p.name for kind in outputs.NOT_KERNEL_REPORTS)]
    assert len(reports) > 20 and set(reports) <= named
    assert set(outputs.snapshots()) <= named and len(outputs.snapshots()) >= 6


def test_a_changed_output_is_caught(monkeypatch):
    case = next(c for c in CASES if c.name == "summarize_h100_tiny_train_bf16.table")
    fresh = outputs.output(case)
    assert fresh == outputs.stored(case)
    changed = fresh.replace(b"matmul", b"matmuL", 1)
    assert changed != fresh and "matmuL" in outputs.difference(case, changed)
