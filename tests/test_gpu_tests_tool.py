"""tools/gpu_tests.py: test files cut into pieces by expected time and run by workers that each see one GPU (two
per GPU by default), the tests that need several GPUs by a worker that sees them all; each test's measured time
stored for the next run, and the summary (run here on the CPU with two named GPUs)."""

import importlib.util
import json
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def tool(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("gpu_tests_tool", REPO / "tools" / "gpu_tests.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "OUT", tmp_path / "out")
    monkeypatch.setattr(module, "SECONDS", tmp_path / "seconds.json")
    return module


def test_tests_are_cut_into_pieces_of_about_a_workers_share_costliest_first(tool):
    files = {"a.py": ["a.py::t1", "a.py::t2", "a.py::slow"], "b.py": ["b.py::t"], "c.py": ["c.py::t1", "c.py::t2"]}
    cost = tool.costs([t for tests in files.values() for t in tests], slow={"a.py::slow"},
                      seconds={"b.py::t": 3.0})
    assert cost == {"a.py::t1": 1, "a.py::t2": 1, "a.py::slow": tool.SLOW_WEIGHT, "b.py::t": 3.0, "c.py::t1": 1,
                    "c.py::t2": 1}
    # Two workers share 12: a.py (7) is cut where its run would pass 6, the rest stay whole; costliest first.
    assert tool.pieces(files, cost, 2) == [["a.py::slow"], ["b.py::t"], ["a.py::t1", "a.py::t2"],
                                           ["c.py::t1", "c.py::t2"]]
    assert tool.pieces(files, cost, 1) == [["a.py::t1", "a.py::t2", "a.py::slow"], ["b.py::t"],
                                           ["c.py::t1", "c.py::t2"]]


PLAIN = """
import os

def test_one_gpu():
    assert os.environ["CUDA_VISIBLE_DEVICES"] in ("0", "1")

def test_skipped():
    import pytest
    pytest.skip("nothing to do")
"""
TOGETHER = """
import os
import pytest

@pytest.mark.multi_gpu
def test_every_gpu():
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"

def test_failing():
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "no such GPU"
"""


@pytest.mark.slow  # several pytest runs
def test_workers_run_pieces_on_their_gpus_and_the_summary_counts_every_outcome(tool, capsys):
    # Under the repository (in results/, which git ignores), so that pytest names the tests from its root.
    (REPO / "results").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=REPO / "results") as folder:
        files = []
        for name, text in (("test_plain.py", PLAIN), ("test_together.py", TOGETHER)):
            files.append(Path(folder) / name)
            files[-1].write_text(textwrap.dedent(text))
        _run_and_check(tool, files, capsys)


def _run_and_check(tool, files: list[Path], capsys) -> None:
    status = tool.main(["-m", "not gpu", "--gpus", "0,1", "--per-gpu", "1", "--commit", "abc1234",
                        *map(str, files)])
    assert status == 1  # test_failing's pytest
    out = capsys.readouterr().out
    summary = json.loads((tool.OUT / "summary.json").read_text())
    assert {k: summary[k] for k in ("commit", "passed", "failed", "error", "skipped", "not_run")} == {
        "commit": "abc1234", "passed": 2, "failed": 1, "error": 0, "skipped": 1, "not_run": 0}
    assert [t.split("::")[1] for t in summary["failures"]] == ["test_failing"]
    assert [w["devices"] for w in summary["workers"]] == ["0", "1", "0,1"]
    assert sum(w["pieces"] for w in summary["workers"]) == 3 and summary["workers"][2]["pieces"] == 1
    assert {p.name for p in tool.OUT.iterdir()} == {"gpu0-0.log", "gpu1-0.log", "gpus-0-1.log", "summary.json"}
    assert out.splitlines()[-1] == tool.summary_line(summary)
    assert out.splitlines()[-1].startswith("GPU tests: 2 passed, 1 failed, 0 error, 1 skipped in ")
    seconds = json.loads(tool.SECONDS.read_text())
    assert len(seconds) == 4 and all(s >= 0 for s in seconds.values())
    # A run whose every piece selects nothing gives pytest's status 5.
    assert tool.main(["-m", "not gpu", "--gpus", "0", *map(str, files), "-k", "no_such_test"]) == 5
    assert {"gpu0-0.log", "gpu0-1.log"} <= {p.name for p in tool.OUT.iterdir()}
