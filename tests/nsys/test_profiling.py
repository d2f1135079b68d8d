"""`profiler-kit nsys` without nsys: the torch.profiler backend end to end on a CPU, the error that points to
it, option checks, and what the nsys backend asks nsys to do (with a fake nsys)."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from profiler_kit.cli import main
from profiler_kit.errors import ProfilerKitError
from profiler_kit.kernels import load
from profiler_kit.nsys_tool import NsysError, NsysInstall
from profiler_kit.recording.builtin import AttentionProfileConfig, ProfileResult, profile, target_command
from profiler_kit.recording.runner import ParentWindow, nsys_command
from profiler_kit.workload import WorkloadConfig

STEPS = 2


def annotations(trace: Path) -> Counter:
    """How often each record_function range occurs in a gzipped Chrome trace."""
    with gzip.open(trace, "rt") as f:
        events = json.load(f)["traceEvents"]
    return Counter(e["name"] for e in events if e.get("cat") == "user_annotation")


def step_numbers(trace: Path) -> list[int]:
    """The program's step numbers of the recorder's step marks in a trace, as the reader sees them."""
    ranges = load(trace).ranges
    return ranges.loc[(ranges["kind"] == "auto") & (ranges["name"] == "step"), "number"].tolist()


def invoke(*args: str):
    return CliRunner().invoke(main, ["nsys", *args])


def test_torch_backend_end_to_end_on_cpu(tmp_path):
    result = invoke("--model", "tiny", "--ctx", "32", "--mode", "train", "--batch-size", "2", "--warmup", "1",
                    "--steps", str(STEPS), "--device", "cpu", "--backend", "torch", "--output-dir",
                    str(tmp_path), "--format", "json")
    assert result.exit_code == 0, result.stderr
    trace = tmp_path / "tiny_ctx32_train.json.gz"
    assert sorted(p.name for p in tmp_path.iterdir()) == [trace.name]
    names = annotations(trace)
    # Only the profiled steps (the program's capture window), numbered as the program counts them (after one
    # warm-up step), with the workload's NVTX ranges as record_functions; its phases are listed in the trace's
    # metadata, and the recorder's own marks are there too.
    assert step_numbers(trace) == [1, 2]
    for phase in ("forward", "backward", "optimizer_step"):
        assert names[phase] == names[f"profiler_kit::{phase}"] == STEPS
    with gzip.open(trace, "rt") as f:
        meta = json.load(f)["profiler_kit"]
    assert meta["phases"] == ["forward", "backward", "optimizer_step"] and meta["notes"] == []
    assert meta["config"]["model"] == "tiny" and (meta["warmup"], meta["steps"]) == (1, STEPS)  # api.describe
    assert f"recorded the steps profiler_kit.capture marks, {STEPS} steps" in result.stderr
    layers = 2  # the tiny preset
    for rng in ("attention", "ffn", "attn_scores", "softmax", "attn_value"):
        assert names[rng] == STEPS * layers
    doc = json.loads(result.stdout)  # no kernels on a CPU: CPU operator time per phase instead
    assert doc["time_basis"] == "cpu_ops" and list(doc["phases"]) == ["forward", "backward", "optimizer_step"]
    # The same again: the recording is kept unless --force, which replaces it.
    kept = invoke("--model", "tiny", "--ctx", "32", "--mode", "train", "--batch-size", "2", "--warmup", "0",
                  "--device", "cpu", "--backend", "torch", "--output-dir", str(tmp_path))
    assert kept.exit_code == 2 and "already exists" in kept.stderr and "--force" in kept.stderr
    assert step_numbers(trace) == [1, 2]
    forced = invoke("--model", "tiny", "--ctx", "32", "--mode", "train", "--batch-size", "2", "--warmup", "0",
                    "--device", "cpu", "--backend", "torch", "--output-dir", str(tmp_path), "--force")
    assert forced.exit_code == 0, forced.stderr
    assert step_numbers(trace) == [0]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_torch_backend_attention_ranges(tmp_path):
    result = invoke("attention", "--impl", "naive,flash-torch", "--dtype", "fp32", "--batch", "1", "--heads",
                    "2", "--seq", "32", "--d", "16", "--device", "cpu", "--warmup", "1", "--steps", "1",
                    "--backend", "torch", "--output-dir", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    names = annotations(tmp_path / "attention_fp32_b1_h2_s32_d16_causal.json.gz")
    for impl in ("naive", "flash-torch"):
        assert names[impl] == names[f"{impl}.forward"] == names[f"{impl}.backward"] == 1


def test_no_nsys_points_to_the_torch_backend(tmp_path, isolated_nsys_search):
    result = invoke("--model", "tiny", "--device", "cpu", "--output-dir", str(tmp_path / "out"))
    assert result.exit_code == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: nsys (Nsight Systems) not found")
    assert "--backend torch" in lines[0]
    assert not (tmp_path / "out").exists()  # nothing started


def test_group_options_are_refused_before_the_attention_subcommand():
    result = invoke("--model", "tiny", "--backend", "torch", "attention", "--seq", "64")
    assert result.exit_code == 2
    assert "--model, --backend: options of `nsys` itself" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--model", "nope"), "unknown model"),
        (("--mode", "inference"), "choose from forward"),
        (("attention", "--impl", "magic"), "choose from naive"),
        (("attention", "--dtype", "fp8"), "choose from fp32"),
    ],
)
def test_bad_options_are_usage_errors(args, message):
    result = invoke(*args)
    assert result.exit_code == 2
    assert message in result.stderr


def test_library_checks(tmp_path):
    cfg = WorkloadConfig("tiny", 32, "forward", device="cpu")
    with pytest.raises(ProfilerKitError, match="unknown backend"):
        profile(cfg, 1, 1, "perfetto", tmp_path)
    with pytest.raises(ProfilerKitError, match="steps ≥ 1"):
        profile(cfg, 0, 0, "torch", tmp_path)
    with pytest.raises(ProfilerKitError, match="unknown implementation magic"):
        AttentionProfileConfig(("naive", "magic")).validate()
    with pytest.raises(ProfilerKitError, match="seq must be positive"):
        AttentionProfileConfig(("naive",), seq=0).validate()
    no_heads = AttentionProfileConfig(("naive",), "fp32", True, 8, None, 4096, 64)
    assert no_heads.tag() == "attention_fp32_b8_s4096_d64_causal"
    with_heads = AttentionProfileConfig(("naive",), "bf16", False, 4, 16, 1024, 64)
    assert with_heads.tag() == "attention_bf16_b4_h16_s1024_d64"
    assert AttentionProfileConfig(("naive", "sdpa-flash")).phases() == (
        "naive.forward", "naive.backward", "sdpa-flash.forward", "sdpa-flash.backward")
    with pytest.raises(ProfilerKitError, match="nothing was recorded"):
        _ = ProfileResult("nsys", "t", "cpu", ParentWindow("whole run"), ()).summary_source
    trace = tmp_path / "t.json.gz"
    assert ProfileResult("torch", "t", "cpu", ParentWindow("whole run"), (), (trace,), (trace,)).summary_source == trace


def test_nsys_command_capture_range_only_with_cuda(tmp_path):
    nsys = NsysInstall(Path("/opt/nsys"), (2025, 3, 1, 90))
    spec = {"workload": {"model": "small"}}
    child = target_command(spec, 2, 1)
    gpu = nsys_command(nsys, tmp_path / "small", child, ranged=True)
    assert gpu[:3] == ["/opt/nsys", "profile", "--trace=cuda,nvtx"]
    assert {"--capture-range=cudaProfilerApi", "--capture-range-end=stop", f"--output={tmp_path / 'small'}"} \
        <= set(gpu)
    program = gpu[gpu.index("-m"):]
    assert program[:3] == ["-m", "profiler_kit.recording.targets", "--spec"]
    assert json.loads(program[3]) == {**spec, "warmup": 2, "steps": 1}
    cpu = nsys_command(nsys, tmp_path / "small", child, ranged=False)
    assert not any(arg.startswith("--capture-range") for arg in cpu)


def test_nsys_that_makes_no_report_is_an_error(tmp_path, fake_nsys):
    silent = fake_nsys("echo 'Collection finished.'")
    with pytest.raises(NsysError, match="made no report"):
        profile(WorkloadConfig("tiny", 32, "forward", device="cpu"), 0, 1, "nsys", tmp_path / "out", silent)
    assert not list((tmp_path / "out").iterdir())  # nor a lock left behind
