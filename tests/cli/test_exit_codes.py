"""One exit-code rule for every command (README, "Exit codes and errors"): 2 when the command is refused before
any work (a usage error, an output that exists without -f, an output that is an input, nothing after `--`), 1
when it fails while working or lacks a tool, a GPU or an input, 3 for a bug, and the program's own status for
`-- COMMAND`. Each command line runs in-process with click's CliRunner; the program's status, where the process
itself matters, in a child process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from profiler_kit.cli import main

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
BF16 = FIXTURES / "kernels" / "h100_tiny_train_bf16.sqlite"
CPU_TRACE = FIXTURES / "kernels" / "cpu_example_mlp_torch.json.gz"
SNAPSHOT = FIXTURES / "memory" / "tiny_ctx128_train_bf16.pickle"
HAS_CUDA = torch.cuda.is_available()
NO_CUDA = pytest.mark.skipif(HAS_CUDA, reason="what a machine without CUDA answers")
TINY = ("--model", "tiny", "--ctx", "8", "--batch-size", "1", "--device", "cpu")

# Placeholders a row's arguments may hold: files the test makes in its own folder.
# A file that exists (as an output: one not to replace without -f); so do {tmp}/rec.json.gz, the built-in
# workload's recording {tmp}/tiny_ctx8_forward.json.gz and {tmp}/people.csv, a CSV that holds no results.
EXISTING = "{existing}"
GARBAGE = "{garbage}"  # a file that is no report of any kind
MISSING = "{missing}"  # a path where nothing is
PROGRAM = "{program}"  # a Python script that exits 0 and never imports torch

# (command line, expected exit status); ids name the command and the rule.
USAGE = [
    (["--max-input-mb", "0", "models"], 2),
    (["nope"], 2),
    (["attention", "bench", "--impl", "nope"], 2),
    (["attention", "bench", "--seq", "nan"], 2),
    (["attention", "bench", "--impl", "naive", "--seq", "16", "--d", "16", "--device", "cpu", "--resume"], 2),
    (["attention", "bench", "--format", "table", "--table", "timings"], 2),
    (["attention", "leaderboard", "--dtype", "fp64"], 2),
    (["benchmark", "--model", "nope"], 2),
    (["benchmark", *TINY, "--ctx", "inf"], 2),
    (["benchmark", *TINY, "--baseline", EXISTING], 2),
    (["benchmark", *TINY, "--resume"], 2),
    (["benchmark", *TINY, "--output", "{tmp}/results.txt"], 2),
    (["benchmark", *TINY, "--output", "{tmp}/people.csv"], 2),
    (["attention", "bench", "--impl", "naive", "--seq", "16", "--d", "16", "--device", "cpu", "--output",
      "{tmp}/results.json"], 2),
    (["kernels", "summarize"], 2),
    (["kernels", "summarize", BF16, "--top", "0"], 2),
    (["kernels", "summarize", BF16, "--table", "phases"], 2),
    (["kernels", "summarize", BF16, "--format", "csv", "--table", "nope"], 2),
    (["kernels", "summarize", BF16, BF16, "--nvtx", "attention"], 2),
    (["kernels", "summarize", MISSING, MISSING, "--nvtx", "attention"], 2),
    (["kernels", "compare", BF16], 2),
    (["kernels", "compare", BF16, CPU_TRACE], 2),
    (["kernels", "compare", BF16, BF16, "--gate", "nope"], 2),
    (["kernels", "whatif", BF16, "--speedup", "matmul"], 2),
    (["kernels", "timeline", BF16], 2),
    (["kernels", "timeline", BF16, "-o", EXISTING], 2),
    (["kernels", "timeline", BF16, "-o", BF16, "--force"], 2),
    (["memory", "--model", "nope"], 2),
    (["memory", "-o", MISSING], 2),
    (["memory", "--"], 2),
    (["memory", "--ctx", "8", "--", sys.executable, PROGRAM], 2),
    (["memory", "python", "train.py"], 2),
    (["memory", "summarize", SNAPSHOT, "--top", "0"], 2),
    (["memory", "summarize", SNAPSHOT, "--html", EXISTING], 2),
    (["memory", "summarize", SNAPSHOT, "--plot", SNAPSHOT, "--force"], 2),
    (["memory", "compare", SNAPSHOT], 2),
    (["models", "--format", "yaml"], 2),
    (["models", "--table", "model_presets"], 2),
    (["nsys", "--model", "nope"], 2),
    (["nsys", *TINY, "--mode", "forward", "--backend", "torch", "--output-dir", "{tmp}"], 2),
    (["nsys", "-o", MISSING], 2),
    (["nsys", "--"], 2),
    (["nsys", "--backend", "torch", "--"], 2),
    (["nsys", "--ctx", "8", "--", sys.executable, PROGRAM], 2),
    (["nsys", "--nsys-args", "'unbalanced", "--", sys.executable, PROGRAM], 2),
    (["nsys", "--backend", "torch", "-o", "{tmp}/rec", "--", sys.executable, PROGRAM], 2),
    (["nsys", "--backend", "torch", "-o", "{tmp}/rec.json.gz", "--", sys.executable, PROGRAM], 2),
    (["nsys", "--backend", "torch", "python", "train.py"], 2),
    (["nsys", "--top", "3", "attention"], 2),
    (["nsys", "attention", "--impl", "nope"], 2),
    (["precision", "--device", "tpu"], 2),
    (["profile"], 2),
    (["profile", "--"], 2),
    (["profile", "--backend", "perf", "--", sys.executable, PROGRAM], 2),
    (["profile", "--memory", "--phase", "x", "--", sys.executable, PROGRAM], 2),
    (["profile", "--nsys-args", "'unbalanced", "--", sys.executable, PROGRAM], 2),
    (["profile", "--format", "csv", "--table", "nope", "--", sys.executable, PROGRAM], 2),
    (["profile", "--columns", "nope", "--", sys.executable, PROGRAM], 2),
    (["profile", "--backend", "torch", "-o", "{tmp}/rec", "--", sys.executable, PROGRAM], 2),
]

FAILED = [
    pytest.param(["attention", "leaderboard"], 1, marks=NO_CUDA),
    pytest.param(["precision", "--device", "cuda"], 1, marks=NO_CUDA),
    (["kernels", "summarize", MISSING], 1),
    (["kernels", "summarize", GARBAGE], 1),
    (["kernels", "compare", BF16, MISSING], 1),
    (["kernels", "compare", "--baseline", GARBAGE, BF16], 1),
    (["kernels", "whatif", CPU_TRACE], 1),
    (["kernels", "whatif", MISSING], 1),
    (["kernels", "timeline", MISSING, "-o", "{tmp}/t.json"], 1),
    pytest.param(["memory", *TINY], 1, marks=NO_CUDA),
    pytest.param(["memory", "-o", "{tmp}/m", "--", sys.executable, PROGRAM], 1, marks=NO_CUDA),
    (["memory", "summarize", MISSING], 1),
    (["memory", "summarize", GARBAGE], 1),
    (["memory", "compare", SNAPSHOT, MISSING], 1),
    (["nsys", *TINY, "--nsys", MISSING, "--output-dir", "{tmp}/p"], 1),
    (["nsys", "--nsys", MISSING, "-o", "{tmp}/p", "--", sys.executable, PROGRAM], 1),
    (["nsys", "--backend", "torch", "-o", "{tmp}/p", "--", "no-such-program-anywhere"], 1),
    (["nsys", "--backend", "torch", "-o", "{tmp}/p", "--", sys.executable, "{tmp}/missing.py"], 1),
    (["nsys", "attention", "--impl", "naive", "--seq", "16", "--d", "16", "--device", "cpu", "--nsys", MISSING,
      "--output-dir", "{tmp}/p"], 1),
    (["profile", "--nsys", MISSING, "-o", "{tmp}/p", "--", sys.executable, PROGRAM], 1),
    (["profile", "-o", "{tmp}/p", "--", "no-such-program-anywhere"], 1),
    pytest.param(["profile", "--memory", "-o", "{tmp}/m", "--", sys.executable, PROGRAM], 1, marks=NO_CUDA),
]

# A bug inside each command: the library call it makes first raises KeyError (module, attribute, command line).
BUGS = [
    ("profiler_kit.attention.bench", "sweep_configs", ["attention", "bench", "--device", "cpu"]),
    ("profiler_kit.attention.bench", "sweep_configs", ["attention", "leaderboard", "--device", "cpu"]),
    ("profiler_kit.benchmark", "sweep_configs", ["benchmark", *TINY]),
    ("profiler_kit.kernels", "summarize_trace", ["kernels", "summarize", BF16]),
    ("profiler_kit.kernels", "compare", ["kernels", "compare", BF16, BF16]),
    ("profiler_kit.kernels.whatif", "what_if", ["kernels", "whatif", BF16]),
    ("profiler_kit.kernels.timeline", "timeline", ["kernels", "timeline", BF16, "-o", "{tmp}/t.json"]),
    ("profiler_kit.recording.builtin", "require_cuda", ["memory", *TINY]),
    ("profiler_kit.recording.runner", "run_program", ["memory", "--", sys.executable, PROGRAM]),
    ("profiler_kit.memory", "analyze_file", ["memory", "summarize", SNAPSHOT]),
    ("profiler_kit.memory", "compare", ["memory", "compare", SNAPSHOT, SNAPSHOT]),
    ("profiler_kit.presets", "preset_table", ["models"]),
    ("profiler_kit.recording.builtin", "profile", ["nsys", *TINY]),
    ("profiler_kit.recording.runner", "run_program", ["nsys", "--", sys.executable, PROGRAM]),
    ("profiler_kit.recording.builtin", "profile_attention", ["nsys", "attention", "--device", "cpu"]),
    ("profiler_kit.precision", "accumulation_experiment", ["precision", "--device", "cpu"]),
    ("profiler_kit.recording.runner", "run_program", ["profile", "--", sys.executable, PROGRAM]),
]


def _ids(rows: list) -> list[str]:
    def one(args: list) -> str:
        return " ".join(Path(a).name if isinstance(a, Path) or "/" in str(a) else str(a) for a in args)[:70]

    return [one(row.values[0] if hasattr(row, "values") else row[0]) for row in rows]


@pytest.fixture
def args_in(tmp_path: Path):
    """A command line's placeholders replaced by files in the test's folder, which the test runs in."""
    files = {EXISTING: tmp_path / "existing.json", GARBAGE: tmp_path / "garbage.json",
             MISSING: tmp_path / "missing.json", PROGRAM: tmp_path / "program.py"}
    files[EXISTING].write_text("earlier")
    files[GARBAGE].write_text("not a report\n")
    files[PROGRAM].write_text("print('done')\n")
    for recording in ("rec.json.gz", "tiny_ctx8_forward.json.gz"):
        (tmp_path / recording).write_text("an earlier recording")
    (tmp_path / "people.csv").write_text("name,email\nada,ada@example.org\n")

    def fill(args: list) -> list[str]:
        out = []
        for arg in map(str, args):
            for placeholder, path in files.items():
                arg = arg.replace(placeholder, str(path))
            out.append(arg.replace("{tmp}", str(tmp_path)))
        return out

    return fill


def _invoke(args: list[str]):
    return CliRunner().invoke(main, args)


def _error_line(stderr: str) -> str:
    return stderr.strip().splitlines()[-1] if stderr.strip() else ""


@pytest.mark.parametrize(("args", "code"), USAGE, ids=_ids(USAGE))
def test_refused_before_any_work_exits_2(args, code, args_in, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    result = _invoke(args_in(args))
    assert result.exit_code == code, result.output
    assert result.stdout == "" and _error_line(result.stderr).startswith("Error: "), result.output
    assert sorted(tmp_path.rglob("*")) == before  # nothing written, nothing replaced


@pytest.mark.parametrize(("args", "code"), FAILED, ids=_ids(FAILED))
def test_failed_while_working_or_missing_a_tool_gpu_or_input_exits_1(args, code, args_in, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = _invoke(args_in(args))
    assert result.exit_code == code, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.output


@pytest.mark.parametrize(("module", "name", "args"), BUGS, ids=_ids([(b[2],) for b in BUGS]))
def test_a_bug_exits_3_in_one_line(module, name, args, args_in, tmp_path, monkeypatch):
    import importlib

    def broken(*_args, **_kwargs):
        raise KeyError("frames")

    monkeypatch.setattr(importlib.import_module(module), name, broken)
    monkeypatch.chdir(tmp_path)
    result = _invoke(args_in(args))
    assert result.exit_code == 3, result.output
    assert _error_line(result.stderr).startswith("Error: internal error: KeyError: 'frames' (a bug;"), result.output


@pytest.mark.parametrize("status", [0, 7])
def test_a_program_under_nsys_gives_its_own_exit_status(status, tmp_path):
    """The whole process: `profiler-kit nsys -- COMMAND` exits with the program's status, its summary printed
    either way (128 + N for a signal is in tests/profile/test_recording.py)."""
    program = tmp_path / "program.py"
    program.write_text(f"import sys\nimport torch\ntorch.ones(8, 8) @ torch.ones(8, 8)\nsys.exit({status})\n")
    proc = subprocess.run([sys.executable, "-m", "profiler_kit", "nsys", "--backend", "torch", "-o",
                           str(tmp_path / "p"), "--format", "json", "--", sys.executable, str(program)],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == status, proc.stderr
    assert '"time_basis": "cpu_ops"' in proc.stdout


@pytest.mark.gpu
def test_memory_of_a_program_gives_its_status_and_keeps_its_snapshot(tmp_path):
    """On a GPU: `memory -- COMMAND` exits with the program's status; the same -o again, with or without the
    `.pickle` the recorder adds, is refused before the program runs (2); --force replaces it."""
    program = tmp_path / "program.py"
    marker = tmp_path / "ran"
    program.write_text(f"import pathlib, sys, torch\npathlib.Path({str(marker)!r}).touch()\n"
                       "x = torch.ones(1 << 20, device='cuda')\nsys.exit(7)\n")

    def memory(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "profiler_kit", "memory", *args, "--format", "json", "--",
                               sys.executable, str(program)], capture_output=True, text=True, cwd=REPO,
                              timeout=300)

    first = memory("-o", str(tmp_path / "m.pickle"))
    assert first.returncode == 7, first.stderr
    assert sorted(p.name for p in tmp_path.glob("m*")) == ["m.pickle"]
    marker.unlink()
    for output in ("m", "m.pickle"):
        again = memory("-o", str(tmp_path / output))
        assert again.returncode == 2 and "already exists" in again.stderr and not marker.exists(), again.stderr
    assert memory("-o", str(tmp_path / "m"), "--force").returncode == 7
