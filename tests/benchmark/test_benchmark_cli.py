"""The benchmark on the tiny model: row fields, failures isolated, output + resume, the CLI contract."""

import json

import pytest
import torch
from click.testing import CliRunner

from profiler_kit import benchmark as bench
from profiler_kit.cli import main
from profiler_kit.recording.targets import build_target
from profiler_kit.results_io import read_rows, run_sweep
from profiler_kit.workload import Workload, WorkloadConfig

TINY = WorkloadConfig("tiny", 16, "train", batch_size=2, device="cpu")


def timing(warmup, steps):
    """A fixed warm-up of `warmup` steps, then `steps` timed ones."""
    return bench.TimingOptions(warmup=warmup, max_warmup=0, steps=steps)


def test_row_fields_and_units():
    row = bench.run_config(TINY, timing(1, 3))
    assert row["status"] == "ok" and row["steps"] == 3 and row["warmup"] == 1 and row["optimizer"] == "adamw-fused"
    assert row["total_ms"] >= row["forward_ms"] > 0 and row["total_ms_std"] >= 0
    assert row["total_ms_p10"] <= row["total_ms_median"] <= row["total_ms_p90"]
    parts = row["forward_ms"] + row["backward_ms"] + row["optimizer_ms"]
    assert parts <= row["total_ms"] < parts * 1.5  # the phases tile the step: the total is their sum plus marks
    assert row["tokens_per_s"] == pytest.approx(2 * 16 / (row["total_ms"] / 1e3))
    assert row["peak_allocated_mib"] is None and row["mfu_pct"] is None  # CPU: no CUDA memory, no peak table
    assert row["params"] == 1_411_392


def test_forward_mode_has_no_backward_or_optimizer_time():
    row = bench.run_config(WorkloadConfig("tiny", 16, "forward", batch_size=2, device="cpu"), timing(0, 2))
    assert row["forward_ms"] > 0 and row["backward_ms"] is None and row["optimizer_ms"] is None


def test_oom_and_errors_are_rows_and_the_sweep_goes_on(monkeypatch):
    real_step = Workload.step

    def failing(self, on_phase_end=None):
        if self.cfg.ctx == 16:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if self.cfg.ctx == 24:
            raise RuntimeError("something else broke")
        return real_step(self, on_phase_end)

    monkeypatch.setattr(Workload, "step", failing)
    configs = bench.sweep_configs(TINY, ["tiny"], [16, 24, 32], ["forward"])
    rows = list(run_sweep(configs, lambda cfg: [bench.run_config(cfg, timing(0, 1))]))
    assert [r["status"] for r in rows] == ["oom", "error", "ok"]
    assert "out of memory" in rows[0]["message"] and "something else broke" in rows[1]["message"]


# No warm-up, one timed step, forward only of the tiny model on the CPU: the cheapest real sweep row.
QUICK_FORWARD = [
    "benchmark", "--model", "tiny", "--mode", "forward", "--device", "cpu", "--warmup", "0", "--max-warmup", "0",
    "--steps", "1",
]  # fmt: skip


def _cli(*args):
    return CliRunner().invoke(main, list(args))


def test_output_and_resume_extend_a_sweep_without_redoing_rows(tmp_path, monkeypatch):
    out = tmp_path / "sweep.jsonl"
    base = QUICK_FORWARD
    first = _cli(*base, "--ctx", "8,16", "--output", str(out), "--format", "json")
    assert first.exit_code == 0, first.output
    assert [r["ctx"] for r in read_rows(out)] == [8, 16]

    ran = []
    real = bench.run_config
    monkeypatch.setattr(bench, "run_config", lambda item, *a: ran.append(item.cfg.ctx) or real(item, *a))
    second = _cli(*base, "--ctx", "8,16,24", "--output", str(out), "--resume", "--format", "json")
    assert second.exit_code == 0, second.output
    assert ran == [24]
    assert [r["ctx"] for r in read_rows(out)] == [8, 16, 24]
    assert sorted(r["ctx"] for r in json.loads(second.stdout)["results"]) == [8, 16, 24]


@pytest.mark.parametrize("suffix", [".csv", ".md"])
def test_resume_reads_csv_and_markdown_outputs(tmp_path, suffix):
    out = tmp_path / f"sweep{suffix}"
    base = [*QUICK_FORWARD, "--output", str(out), "--format", "csv"]
    assert _cli(*base, "--ctx", "8").exit_code == 0
    result = _cli(*base, "--ctx", "8,12", "--resume")
    assert result.exit_code == 0, result.output
    rows = read_rows(out)
    assert [r["ctx"] for r in rows] == [8, 12] and all(r["status"] == "ok" for r in rows)


def test_json_output_contract():
    result = _cli(
        "benchmark",
        "--model",
        "tiny",
        "--ctx",
        "8",
        "--mode",
        "train",
        "--device",
        "cpu",
        "--warmup",
        "1",
        "--max-warmup",
        "1",
        "--steps",
        "2",
        "--format",
        "json",
    )
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)  # stdout is only the JSON document
    assert document["schema_version"] >= 1 and "environment" in document
    (row,) = document["results"]
    for key in (
        "model",
        "ctx",
        "mode",
        "mixed_precision",
        "compile",
        "status",
        "steps",
        "warmup",
        "forward_ms",
        "backward_ms",
        "optimizer_ms",
        "total_ms",
        "total_ms_std",
        "tokens_per_s",
        "peak_allocated_mib",
    ):
        assert key in row
    assert row["peak_allocated_mib"] is None and row["steps"] == 2 and row["status"] == "ok"


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--model", "gpt5"], "unknown model"),
        (["--ctx", "0"], "must be positive"),
        (["--ctx", "-8"], "must be positive"),
        (["--steps", "0"], "--steps"),
        (["--batch-size", "0"], "--batch-size"),
        (["--mode", "inference"], "choose from"),
        (["--attention", "sdpa,flashy"], "choose from"),
        (["--resume"], "--resume needs --output"),
        (["--output", "x.txt"], "unsupported extension"),
    ],
)
def test_bad_options_are_usage_errors_not_tracebacks(args, fragment):
    result = _cli("benchmark", "--model", "tiny", "--device", "cpu", *args)
    assert result.exit_code != 0
    assert fragment in result.output
    assert (
        "Traceback" not in result.output
        and result.exception is None
        or isinstance(result.exception, SystemExit)
    )


def test_the_optimizer_reaches_the_profiled_workload():
    """`nsys` and `memory` hand the config to the profiled process as a spec of WorkloadConfig fields."""
    cfg = WorkloadConfig("tiny", 8, "train", batch_size=1, device="cpu", optimizer="adamw-foreach")
    target = build_target({"workload": cfg.as_dict()}, note=print)
    assert target.step.__self__.optimizer.defaults["foreach"] is True


@pytest.mark.parametrize("command", ["nsys", "memory", "benchmark"])
def test_an_unknown_optimizer_is_a_usage_error(command):
    result = _cli(command, "--optimizer", "sgd")
    assert result.exit_code == 2 and "adamw-fused" in result.output


def test_overlap_rows_carry_the_exposed_optimizer_time_and_the_clipping_fallback():
    """`--optimizer-overlap` rows, with and without clipping: `opt_exposed_ms` is the optimizer phase (the step
    past the backward's end), the config columns say overlap and clipping, the fallback is in the message."""
    rows = []
    for clip in ([], ["--clip-grad-norm", "1.5"]):
        result = _cli("benchmark", "--model", "tiny", "--ctx", "8", "--device", "cpu", "--warmup", "1",
                      "--max-warmup", "1", "--steps", "2", "--optimizer-overlap", *clip, "--format", "json")
        assert result.exit_code == 0, result.output
        rows += json.loads(result.stdout)["results"]
    plain, clipped = rows
    for row in rows:
        assert row["status"] == "ok" and row["optimizer_overlap"] is True
        assert row["opt_exposed_ms"] == row["optimizer_ms"] > 0
    assert plain["clip_grad_norm"] is None and plain["message"] == ""
    assert clipped["clip_grad_norm"] == 1.5 and "after the backward" in clipped["message"]
    row = bench.run_config(WorkloadConfig("tiny", 16, "forward", batch_size=2, device="cpu"), timing(0, 1))
    assert row["opt_exposed_ms"] is None


def test_the_overlap_needs_a_train_step():
    result = _cli("benchmark", "--model", "tiny", "--device", "cpu", "--mode", "forward", "--optimizer-overlap")
    assert result.exit_code != 0 and "needs a train step" in result.output


@pytest.mark.parametrize("command", ["benchmark", "nsys"])  # `memory` needs a CUDA device anyway
def test_a_memory_limit_needs_a_cuda_device(command):
    """`--memory-limit-gib` caps the CUDA caching allocator: on the CPU it is refused with one line, exit 1 (a
    GPU is what the command needs), before any step runs."""
    result = _cli(command, "--model", "tiny", "--ctx", "8", "--device", "cpu", "--memory-limit-gib", "1")
    assert result.exit_code == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last == "Error: --memory-limit-gib caps CUDA memory: it needs a CUDA device"
