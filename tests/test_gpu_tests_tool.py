"""tools/gpu_tests.py: test files split over the GPUs by expected time, one pytest process per GPU at once (run
here on the CPU with two named GPUs and CPU tests), measured times stored for the next split."""

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


def test_files_are_split_into_groups_of_about_equal_cost(tool):
    assert tool.split({"a": 5, "b": 4, "c": 3, "d": 2, "e": 1}, 2) == [["a", "d", "e"], ["b", "c"]]
    assert tool.split({"a": 1}, 4) == [["a"]]
    files = {"x.py": ["x.py::fast", "x.py::slow"], "y.py": ["y.py::t1", "y.py::t2"], "z.py": ["z.py::t"]}
    cost = tool.weights(files, slow={"x.py::slow"}, seconds={"z.py": 40.0})
    assert cost == {"x.py": 1 + tool.SLOW_WEIGHT, "y.py": 2, "z.py": 40.0}


def test_two_gpus_run_their_groups_at_once_and_store_each_files_time(tool, capsys):
    files = ["tests/test_errors.py", "tests/cli/test_models.py"]
    assert tool.main(["-m", "not gpu", "--gpus", "0,1", *files]) == 0
    out = capsys.readouterr().out
    assert "GPU 0: passed" in out and "GPU 1: passed" in out
    assert {p.name for p in tool.OUT.iterdir()} == {"gpu0.log", "gpu1.log"}
    seconds = json.loads(tool.SECONDS.read_text())
    assert set(seconds) == set(files) and sum(seconds.values()) > 0
    # A group whose pytest fails gives the run its exit status (5: no test ran).
    assert tool.main(["-m", "not gpu", "--gpus", "0,1", *files, "-k", "no_such_test"]) == 5
