"""The one error boundary and its exit codes (0 done, 1 failed, 2 usage, 3 internal, 130 interrupted), `--debug`
for the traceback, a CPU out-of-memory marked like a CUDA one, and a command this machine cannot run refused
at once."""

from __future__ import annotations

import json
import time

import pytest
import torch
from click.testing import CliRunner

import profiler_kit.kernels as kernels_lib
from profiler_kit.cli import main

FIXTURE = "tests/fixtures/kernels/h100_tiny_train_bf16.sqlite"


def broken(exc: BaseException):
    def summarize(*args, **kwargs):
        raise exc

    return summarize


@pytest.mark.parametrize(("exc", "code", "phrase"), [
    (KeyError("frames"), 3, "internal error: KeyError: 'frames' (a bug; rerun with --debug"),
    (OSError(28, "No space left on device", "/data/out.png"), 1, "/data/out.png: No space left on device"),
    (MemoryError(), 1, "out of memory"),
    (KeyboardInterrupt(), 130, "interrupted"),
])
def test_every_failure_is_one_line_with_its_exit_code(monkeypatch, exc, code, phrase):
    monkeypatch.setattr(kernels_lib, "summarize_trace", broken(exc))
    result = CliRunner().invoke(main, ["kernels", "summarize", FIXTURE])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == code and result.stdout == ""
    assert len(lines) == 1 and lines[0].startswith(f"Error: {phrase}"), result.stderr


def test_a_usage_error_exits_2():
    assert CliRunner().invoke(main, ["kernels", "summarize", FIXTURE, "--top", "0"]).exit_code == 2


@pytest.mark.parametrize("how", [["--debug"], "PROFILER_KIT_DEBUG"])
def test_debug_shows_the_exception(monkeypatch, how):
    monkeypatch.setattr(kernels_lib, "summarize_trace", broken(KeyError("frames")))
    args, env = (how, {}) if isinstance(how, list) else ([], {how: "1"})
    result = CliRunner().invoke(main, [*args, "kernels", "summarize", FIXTURE], env=env)
    assert isinstance(result.exception, KeyError)  # raised through the boundary: Python prints its traceback


def test_a_cpu_out_of_memory_is_an_oom_row_and_the_sweep_goes_on(cli):
    """xl's parameters alone need 6 GB: under a 4 GiB address space the allocation fails, as it would on a
    machine with too little memory."""
    proc = cli("benchmark", "--model", "xl,tiny", "--ctx", "16", "--batch-size", "1", "--steps", "1",
               "--warmup", "0", "--max-warmup", "0", "--device", "cpu", "--format", "json",
               timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = {r["model"]: r for r in json.loads(proc.stdout)["results"]}
    assert rows["xl"]["status"] == "oom" and "out of host memory" in rows["xl"]["message"]
    assert rows["tiny"]["status"] == "ok"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the leaderboard runs where there is a GPU")
def test_the_leaderboard_without_a_gpu_says_so_at_once():
    start = time.monotonic()
    result = CliRunner().invoke(main, ["attention", "leaderboard"])
    assert result.exit_code == 1 and "needs a CUDA GPU" in result.stderr
    assert time.monotonic() - start < 30
