"""tools/gpu_tests.py: test files split over the GPUs by expected time, one pytest process per GPU at once (run
here on the CPU with two named GPUs and CPU tests), each test's measured time stored for the next split."""

import importlib.util
import json
import sys
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


def test_tests_are_split_into_groups_of_about_equal_cost_keeping_files_together(tool):
    files = {"a.py": ["a.py::t1", "a.py::t2", "a.py::slow"], "b.py": ["b.py::t"], "c.py": ["c.py::t1", "c.py::t2"]}
    cost = tool.costs([t for tests in files.values() for t in tests], slow={"a.py::slow"},
                      seconds={"b.py::t": 3.0})
    assert cost == {"a.py::t1": 1, "a.py::t2": 1, "a.py::slow": tool.SLOW_WEIGHT, "b.py::t": 3.0, "c.py::t1": 1,
                    "c.py::t2": 1}
    # Two groups share 12: a.py (7) is cut where its run would pass 6, the rest stay whole.
    assert tool.pieces(files, cost, 2) == [["a.py::t1", "a.py::t2"], ["a.py::slow"], ["b.py::t"],
                                           ["c.py::t1", "c.py::t2"]]
    groups = tool.split(tool.pieces(files, cost, 2), cost, 2)
    assert groups == [["a.py::slow", "c.py::t1", "c.py::t2"], ["b.py::t", "a.py::t1", "a.py::t2"]]
    assert tool.split(tool.pieces(files, cost, 8), cost, 8)[0] == ["a.py::slow"]


@pytest.mark.slow  # four pytest runs
def test_two_gpus_run_their_groups_at_once_and_store_each_tests_time(tool, capsys):
    files = ["tests/test_errors.py", "tests/cli/test_models.py"]
    assert tool.main(["-m", "not gpu", "--gpus", "0,1", *files]) == 0
    out = capsys.readouterr().out
    assert "GPU 0: passed" in out and "GPU 1: passed" in out
    assert {p.name for p in tool.OUT.iterdir()} == {"gpu0.log", "gpu1.log"}
    seconds = json.loads(tool.SECONDS.read_text())
    assert {test.split("::")[0] for test in seconds} == set(files) and sum(seconds.values()) > 0
    assert set(seconds) == {t for tests in tool.collect("not gpu", files).values() for t in tests}
    # Two processes on one GPU; a group whose pytest fails gives the run its exit status (5: no test ran).
    assert tool.main(["-m", "not gpu", "--gpus", "0", "--per-gpu", "2", *files, "-k", "no_such_test"]) == 5
    assert {"gpu0-0.log", "gpu0-1.log"} <= {p.name for p in tool.OUT.iterdir()}
