"""`profiler-kit nsys -- COMMAND`: any program under torch.profiler (CPU) and under a real nsys, its exit status,
the one-line errors, and the API it uses (`phase`, `capture`, `instrument`)."""

from __future__ import annotations

import gzip
import json
import sqlite3
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import profiler_kit
from profiler_kit.cli import main
from profiler_kit.errors import ProfilerKitError
from profiler_kit.kernels import load, summarize
from profiler_kit.recording import api
from profiler_kit.recording.runner import merge_flags, program_name

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_mlp.py"
SMALL = ["--width", "32", "--depth", "2", "--vocab", "64", "--batch", "2", "--seq", "16", "--warmup", "1",
         "--steps", "2"]


def nsys_cli(*args: object):
    return CliRunner().invoke(main, ["nsys", *map(str, args)])


def annotations(trace: Path) -> Counter:
    with gzip.open(trace, "rt") as fh:
        return Counter(e["name"] for e in json.load(fh)["traceEvents"] if e.get("cat") == "user_annotation")


def one_line_error(result) -> str:
    assert result.exit_code != 0
    lines = result.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("Error: ") and "Traceback" not in result.stderr, result.stderr
    return lines[-1]


def test_torch_backend_profiles_the_example_unchanged(tmp_path):
    out = tmp_path / "example"
    result = nsys_cli("--backend", "torch", "--output", out, "--format", "json", "--",
                      sys.executable, EXAMPLE, *SMALL)
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)  # stdout is the summary alone: the program's own output went to stderr
    assert "loss" in result.stderr
    assert doc["time_basis"] == "cpu_ops"
    assert list(doc["phases"]) == ["fwd", "bwd", "opt"]
    assert doc["categories"]["matmul"] > 0 and doc["categories"]["normalization"] > 0
    assert all(doc["phases"][p]["total_ns"] > 0 for p in ("fwd", "bwd", "opt"))
    names = annotations(tmp_path / "example.json.gz")
    # capture(warmup=1, steps=2): the two marked steps only (the program's steps 1 and 2), each with every
    # block's forward and backward.
    assert names["profiler_kit::step#1"] == names["profiler_kit::step#2"] == 1 and names["fwd"] == 2
    assert names["blocks.0.forward"] == 2 and names["blocks.1.backward"] == 2
    # The same command again would replace the trace: refused.
    again = nsys_cli("--backend", "torch", "--output", out, "--", sys.executable, EXAMPLE, *SMALL)
    assert "already exists" in one_line_error(again)


def test_the_program_exit_status_comes_back(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("import sys\nimport profiler_kit\nimport torch\n"
                      "with profiler_kit.phase('work'):\n    torch.ones(8, 8) @ torch.ones(8, 8)\nsys.exit(3)\n")
    result = nsys_cli("--backend", "torch", "-o", tmp_path / "fails", "--", sys.executable, script)
    assert result.exit_code == 3, result.stderr
    assert "the program exited with status 3" in result.stderr
    assert summarize(tmp_path / "fails.json.gz").phase_names == ["work"]


@pytest.mark.parametrize("backend", ["torch", "nsys"])
def test_a_missing_program_is_one_line(tmp_path, backend):
    missing = one_line_error(nsys_cli("--backend", backend, "-o", tmp_path / "x", "--", "no-such-program-pk"))
    assert "no-such-program-pk: no such program" in missing
    script = one_line_error(nsys_cli("--backend", backend, "-o", tmp_path / "x", "--", sys.executable,
                                     tmp_path / "absent.py"))
    assert "absent.py: no such file" in script


def test_a_missing_nsys_is_one_line(tmp_path, isolated_nsys_search):
    line = one_line_error(nsys_cli("-o", tmp_path / "x", "--", sys.executable, EXAMPLE))
    assert "nsys (Nsight Systems) not found" in line and "--backend torch" in line


def test_options_of_the_built_in_workload_are_refused_with_a_command(tmp_path):
    result = nsys_cli("--model", "tiny", "--", sys.executable, EXAMPLE)
    assert result.exit_code == 2 and "--model" in result.stderr
    assert nsys_cli("--output", tmp_path / "x", "--model", "tiny").exit_code == 2


def test_default_output_names_and_flag_merging():
    assert program_name(["python", "examples/train_mlp.py", "--x"]) == "train_mlp"
    assert program_name(["torchrun", "--nproc-per-node", "2", "ddp.py"]) == "ddp"
    assert program_name(["./run.sh"]) == "run"
    assert merge_flags(["--trace=cuda,nvtx", "--sample=none"], ("--trace=nvtx,osrt",)) == [
        "--sample=none", "--trace=nvtx,osrt"]


def test_nsys_backend_records_a_real_cpu_run(tmp_path, nsys, nvtx_shim):
    """Debian's nsys 2022.4 on a CPU: the whole run, with the program's ranges and the recorder's marks. That
    nsys drops the `nvtx` package's ranges, so a C shim makes them while it records (see the fixtures' README)."""
    lib, wrapper = nvtx_shim
    out = tmp_path / "cpu_run"
    # This nsys records NVTX data only while it also traces OS runtime calls.
    result = nsys_cli("--nsys", nsys.path, "--nsys-args", "--trace=nvtx,osrt --osrt-threshold=100000000", "-o", out,
                      "--modules", "depth:3", "--format", "json", "--", sys.executable, wrapper, lib, EXAMPLE, *SMALL)
    # No CUDA here: no kernels, and nsys records no CPU operators; the files are kept, the error says why.
    line = one_line_error(result)
    assert result.exit_code == 1 and "no CUDA device here" in line and "--backend torch" in line
    assert "recorded the whole run, 3 steps" in result.stderr
    assert (tmp_path / "cpu_run.nsys-rep").is_file() and (tmp_path / "cpu_run.sqlite").is_file()
    assert not list(tmp_path.glob(".cpu_run*"))
    ranges = load(tmp_path / "cpu_run.sqlite").ranges
    counts = ranges.groupby(["name", "kind"]).size()
    # No CUDA here, so no capture range: all three steps, warm-up included; the phases in the profiler_kit
    # domain, the program's own ranges, and the recorder's marks on their own lane, steps numbered 0, 1, 2.
    assert counts["fwd", "phase"] == 3 and counts["blocks.1.backward", "program"] == 3
    assert counts["forward", "auto"] == counts["backward", "auto"] == counts["optimizer_step", "auto"] == 3
    steps = ranges[(ranges["name"] == "step") & (ranges["kind"] == "auto")]
    assert steps["number"].tolist() == [0, 1, 2] and (steps["thread"] < 0).all()
    assert counts["Optimizer.step#AdamW.step", "program"] == 3  # PyTorch's record_function, mirrored to NVTX
    assert summarize(tmp_path / "cpu_run.sqlite").phase_names == ["fwd", "bwd", "opt"]
    # The module marks: start/end ranges of the domain's module categories, the metadata a mark of `modules`.
    modules, metadata = module_ranges(tmp_path / "cpu_run.sqlite")
    for path in ("embed", "blocks", "blocks.0", "blocks.1.up", "head"):
        assert modules["module", path] == 3 and modules["module_backward", path] == 3, path
    assert not any(category == "module_recompute" for category, _ in modules)
    assert metadata["types"]["blocks.1"] == "Block" and metadata["types"]["blocks.1.up"] == "Linear"
    assert metadata["flops"]["step"] == 0 and metadata["flops"]["modules"]["blocks.1.up"]["forward"] > 0


def module_ranges(export: Path) -> tuple[Counter, dict]:
    """The module ranges of an nsys export by (category, path), and the latest metadata mark's JSON (one process,
    one domain)."""
    with sqlite3.connect(export) as con:
        kinds = dict(con.execute("SELECT name, id FROM ENUM_NSYS_EVENT_TYPE").fetchall())
        rows = con.execute("SELECT n.eventType, n.category, coalesce(n.text, s.value) FROM NVTX_EVENTS AS n "
                           "LEFT JOIN StringIds AS s ON s.id = n.textId ORDER BY n.start").fetchall()
    categories = {category: text for kind, category, text in rows if kind == kinds["NvtxCategory"]}
    ranges = Counter((categories.get(category), text) for kind, category, text in rows
                     if kind == kinds["NvtxStartEndRange"] and categories.get(category, "").startswith("module"))
    marks = [text for kind, category, text in rows
             if kind == kinds["NvtxMark"] and categories.get(category) == "modules"]
    return ranges, json.loads(marks[-1])


# The API


def test_phase_is_a_context_manager_and_a_decorator():
    @profiler_kit.phase("decorated")
    def work() -> torch.Tensor:
        return torch.ones(4, 4) @ torch.ones(4, 4)

    with torch.profiler.profile() as prof:
        with profiler_kit.phase("outer"):
            work()
            work()
    names = Counter(e.name for e in prof.events())
    assert names["outer"] == 1 and names["decorated"] == 2


class Calls:
    """A recorder that writes down what `capture` asks of it."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def declare(self) -> None:
        self.calls.append("declare")

    def start(self) -> None:
        self.calls.append("start")

    def stop(self, steps: int) -> None:
        self.calls.append(f"stop {steps}")


@pytest.fixture
def calls(monkeypatch) -> Calls:
    recorder = Calls()
    monkeypatch.setattr(api, "_recorder", [recorder])
    return recorder


def test_capture_starts_and_stops_around_the_marked_steps(calls):
    cap = profiler_kit.capture(warmup=2, steps=2)
    seen = []
    for i in range(6):
        with cap.step():
            seen.append((i, cap.recording))
    assert calls.calls == ["declare", "start", "stop 2"]
    assert [i for i, recording in seen if recording] == [2, 3]


def test_capture_stops_when_the_loop_ends_early(calls):
    with profiler_kit.capture(warmup=0, steps=5) as cap:
        with cap.step():
            pass
    assert calls.calls == ["declare", "start", "stop 1"]


def test_capture_rejects_bad_counts():
    with pytest.raises(ProfilerKitError, match="steps ≥ 1"):
        profiler_kit.capture(warmup=0, steps=0)


def test_instrument_ranges_forward_and_backward_of_each_block():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(8, 2)))
    handles = profiler_kit.instrument(model, depth=1)
    assert handles.names == ["0", "1"]
    x = torch.randn(3, 4, requires_grad=True)
    with torch.profiler.profile() as prof:
        model(x).sum().backward()
    names = Counter(e.name for e in prof.events())
    for name in ("0.forward", "1.forward", "0.backward", "1.backward"):
        assert names[name] == 1, name
    assert names["1.1.forward"] == 0  # deeper than depth 1
    handles.remove()
    with torch.profiler.profile() as prof:
        model(x).sum().backward()
    assert "0.forward" not in {e.name for e in prof.events()}


def test_phase_and_forward_instrumentation_compile_without_graph_breaks():
    @torch.compile(backend="eager", fullgraph=True)
    def step(x: torch.Tensor) -> torch.Tensor:
        with profiler_kit.phase("inside"):
            return x.sin() + 1

    assert torch.equal(step(torch.zeros(3)), torch.ones(3))
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    profiler_kit.instrument(model, depth=1, backward=False)
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    x = torch.randn(2, 4)
    assert torch.equal(compiled(x), model(x))
