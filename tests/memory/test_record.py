"""Recording: a clear error without CUDA; on a GPU, a real recording (and the committed fixture made by one)
is a protocol-4 pickle whose trace agrees with the allocator's counters, whose phases land where their
allocations are, and whose model state matches the config; an OOM inside the recorded step still dumps."""

import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from profiler_kit.cli import main
from profiler_kit.errors import ProfilerKitError
from profiler_kit.memory import analyze_file, load_snapshot
from profiler_kit.memory.analyze import first_user_frame
from profiler_kit.presets import count_parameters, from_name
from profiler_kit.recording import builtin, runner
from profiler_kit.recording.builtin import record_memory
from profiler_kit.recording.history import oom_summary
from profiler_kit.workload import PHASES, WorkloadConfig, phases_for

FIXTURE = Path(__file__).parents[1] / "fixtures" / "memory" / "tiny_ctx128_train.pickle"
# The allocator counts whole blocks (rounded up, and unsplit remainders below 1 MiB); the trace counts
# requested bytes. On a small model the two differ by well under this fraction.
ROUNDING_SLACK = 0.2


def test_cpu_device_is_refused_with_one_line():
    result = CliRunner().invoke(main, ["memory", "--model", "tiny", "--ctx", "16", "--device", "cpu"])
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith("Error: memory snapshots need a CUDA device")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_record_without_cuda_raises(tmp_path):
    with pytest.raises(ProfilerKitError, match="need a CUDA device"):
        record_memory(WorkloadConfig("tiny", 16), output_dir=tmp_path)
    assert not any(tmp_path.iterdir())


def test_oom_summary_keeps_the_requested_size():
    message = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of "
               "which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.12 GiB memory "
               "in use.")
    assert oom_summary(RuntimeError(message)) == "Tried to allocate 2.00 GiB"


# The built-in workload as a program under the memory recorder, on a CPU: torch's allocator API is replaced
# inside the program by fakes (CUDA's start-up runs the calls queued for it; every module call raises the peak
# counter by 1000; `OOM_AT` makes the optimizer step of that step number fail as the allocator would, after
# telling its out-of-memory observers). The GPU tests below run the same flow against the real allocator.
FAKE_ALLOCATOR = """
import json, os, sys, torch
peak, observers, steps = [0], [], [0]
torch.cuda.synchronize = lambda *a: None
torch.cuda.get_device_name = lambda *a: "Fake GPU"
torch.cuda.reset_peak_memory_stats = lambda *a: peak.__setitem__(0, 0)
torch.cuda.max_memory_allocated = torch.cuda.max_memory_reserved = lambda *a: peak[0]
torch._C._cuda_attach_out_of_memory_observer = observers.append
torch.cuda.memory._record_memory_history = lambda enabled="all", **kw: print(
    "history", json.dumps([enabled, kw.get("stacks"), kw.get("global_record_annotations")]), file=sys.stderr)
block = {"address": 4096, "size": 512, "requested_size": 512, "state": "active_allocated"}
torch.cuda.memory._snapshot = lambda: {
    "segments": [{"device": 0, "address": 4096, "total_size": 2 << 20, "blocks": [block]}],
    "device_traces": [[{"action": "alloc", "addr": 4096, "size": 512, "stream": 0, "time_us": 1}]]}
for call, _ in torch.cuda._queued_calls:
    call()
torch.nn.modules.module.register_module_forward_hook(lambda *a: peak.__setitem__(0, peak[0] + 1000))

def optimizer_step(*_):
    steps[0] += 1
    if steps[0] == int(os.environ.get("OOM_AT", "0")):
        for observer in observers:
            observer(0, 9 << 30, 0, 0)
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB. GPU 0 ...")

from torch.optim.optimizer import register_optimizer_step_pre_hook
register_optimizer_step_pre_hook(optimizer_step)
from profiler_kit.recording.targets import main
sys.exit(main(sys.argv[1:]))
"""

CPU_TINY = WorkloadConfig("tiny", 16, "train", batch_size=2, device="cpu")


@pytest.fixture
def fake_allocator(tmp_path, monkeypatch):
    """`record_memory` runs the built-in workload under FAKE_ALLOCATOR."""
    program = tmp_path / "fake_allocator.py"
    program.write_text(textwrap.dedent(FAKE_ALLOCATOR))
    monkeypatch.setattr(builtin, "require_cuda", lambda cfg: None)
    monkeypatch.setattr(runner, "cuda_device_present", lambda: True)
    made = builtin.target_command
    monkeypatch.setattr(builtin, "target_command", lambda *a: [sys.executable, str(program), *made(*a)[3:]])
    return monkeypatch


def test_the_builtin_workload_is_recorded_through_the_program_recorder(fake_allocator, tmp_path, capfd):
    result = record_memory(CPU_TINY, steps=2, warmup=3, max_entries=1234, output_dir=tmp_path / "out")
    err = capfd.readouterr().err
    # The whole-run history from CUDA's start-up, restarted at the capture window, stopped at its end.
    assert err.count('history ["all", "python", true]') == 2 and err.count("history [null, null, null]") == 1
    assert result.snapshot_path == tmp_path / "out" / "tiny_ctx16_train.pickle"
    assert result.snapshot_path.read_bytes()[:2] == b"\x80\x04"
    side = json.loads(result.sidecar_path.read_text())
    assert side == result.sidecar == load_snapshot(result.snapshot_path)["profiler_kit"]
    assert side["max_entries"] == 1234 and side["oom"] is None and result.oom is None
    assert (side["steps"], side["warmup"], side["config"]["model"]) == (2, 3, "tiny")
    assert side["window"] == "profiler_kit.capture" and len(side["linear_weight_numels"]) == 5 * 2 + 1
    # Phases by the program's own step numbers (3 and 4, after 3 warm-up steps): its profiler_kit.phase ranges
    # and the recorder's marks.
    by_kind = {kind: [(p["step"], p["phase"]) for p in side["phases"] if p["kind"] == kind]
               for kind in ("phase", "auto")}
    assert by_kind["phase"] == [(s, p) for s in (3, 4) for p in PHASES]
    assert by_kind["auto"] == by_kind["phase"]
    forward = next(p for p in side["phases"] if p["kind"] == "phase" and p["phase"] == "forward")
    assert forward["peak_allocated_bytes"] > 0 and forward["completed"]
    assert all(p["start_time_us"] <= p["end_time_us"] for p in side["phases"])
    # A phase's peak is the counter's rise during it (none in backward here: no module call); the counter was
    # reset when the window opened, so the window's peak is the last forward's, twice the first's.
    peaks = [p["peak_allocated_bytes"] for p in side["phases"] if p["kind"] == "phase" and p["phase"] == "forward"]
    assert side["peak_allocated_bytes"] == peaks[1] == 2 * peaks[0]
    assert all(p["peak_allocated_bytes"] is None for p in side["phases"] if p["phase"] == "backward")
    labels = [c["label"] for c in side["storages"]]
    assert labels == ["window start", "optimizer step 1", "optimizer step 2"]
    capture = side["storages"][-1]
    assert len(capture["parameter"]) == len(capture["gradient"]) == 7 * 2 + 3  # tiny has 2 layers
    # AdamW (fused, as the workload's default; on the CPU a plain tensor step): exp_avg, exp_avg_sq and the step.
    assert len(capture["optimizer_state"]) == 3 * len(capture["parameter"])
    assert side["notes"] == []


def test_oom_in_a_recorded_step_dumps_then_exits_nonzero(fake_allocator, tmp_path):
    fake_allocator.setenv("OOM_AT", "3")  # the optimizer step of step 2, the first recorded one
    args = ["memory", "--model", "tiny", "--ctx", "16", "--batch-size", "2", "--device", "cpu",
            "--warmup", "2", "--output-dir", str(tmp_path), "--format", "json", "--no-html"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    assert result.stderr.strip().splitlines()[-1] == (
        "Error: out of memory in optimizer_step of recorded step 1 (Tried to allocate 9.00 GiB); the snapshot "
        f"was saved anyway: {tmp_path / 'tiny_ctx16_train.pickle'}")
    side = json.loads((tmp_path / "tiny_ctx16_train.json").read_text())
    assert side["oom"]["step"] == 2 and side["oom"]["phase"] == "optimizer_step"
    unfinished = [(p["phase"], p["kind"]) for p in side["phases"] if not p["completed"]]
    assert ("optimizer_step", "phase") in unfinished
    assert (tmp_path / "tiny_ctx16_train.png").exists()


def _user_frame_share(report, span) -> float:
    """Share of the allocations made in a phase whose stack has a Python frame outside torch."""
    a = report.recon.allocations
    made = a[(a["start"] >= span.start) & (a["start"] < span.end)]
    return sum(first_user_frame(frames) is not None for frames in made["frames"]) / max(len(made), 1)


def check_recording(path: Path) -> None:
    assert path.read_bytes()[:2] == b"\x80\x04"  # pickle protocol 4, what memory_viz reads
    report = analyze_file(path)
    side, recon = report.meta, report.recon
    assert side is not None and side["oom"] is None
    cfg = side["config"]
    marked = [p for p in side["phases"] if p.get("kind", "phase") == "phase"]  # older recordings: no kind
    assert [p["phase"] for p in marked] == list(phases_for(cfg["mode"])) * side["steps"]
    assert [p["step"] for p in marked] == sorted(p["step"] for p in marked)
    assert (1 - ROUNDING_SLACK) * side["peak_allocated_bytes"] <= recon.peak_allocated_bytes
    assert recon.peak_allocated_bytes <= side["peak_allocated_bytes"]
    # Forward and the optimizer run model code on the main thread; backward runs on the autograd engine's
    # thread, which has no Python frames. A misplaced boundary mixes the two.
    assert report.spans and all(span.end > span.start for span in report.spans)
    for span in report.spans:
        share = _user_frame_share(report, span)
        if span.phase in ("forward", "optimizer_step"):
            assert share > 0.9, (span.label, share)
        if span.phase == "backward":
            assert share < 0.5, (span.label, share)
    rows = report.expected.set_index("tensor")
    assert rows.loc["parameters", "count_at_peak"] == rows.loc["parameters", "expected_count"]
    if cfg["mode"] == "train":
        adamw = rows.loc["AdamW state (exp_avg, exp_avg_sq)"]
        assert adamw["count_at_peak"] == adamw["expected_count"]  # allocated in warm-up, alive throughout
        assert rows.loc["gradients", "allocs_in_trace"] == rows.loc["gradients", "expected_count"]
    assert report.top["where"].fillna("").str.startswith("profiler_kit/").any()
    by_role = report.roles_at_peak.set_index("role")
    assert by_role.loc["parameter", "size_bytes"] == 4 * count_parameters(from_name(cfg["model"], cfg["ctx"]))


def check_self_describing(path: Path) -> None:
    """A new recording analyses the same from the pickle alone, and its phases are annotated ranges in it."""
    with_sidecar = analyze_file(path).to_json()
    alone = analyze_file(path, use_sidecar=False).to_json()
    assert (with_sidecar.pop("metadata_source"), alone.pop("metadata_source")) == ("sidecar", "snapshot")
    assert with_sidecar == alone
    snapshot = load_snapshot(path)
    names = {a["name"] for a in snapshot["external_annotations"] if a["stage"] == "START"}
    phases = phases_for(snapshot["profiler_kit"]["config"]["mode"])
    assert set(phases) <= names and {f"profiler_kit::{p}" for p in phases} <= names  # the recorder's marks too


@pytest.mark.skipif(not FIXTURE.exists(), reason="the H100 recording is committed by the lead")
def test_committed_h100_fixture():
    check_recording(FIXTURE)
    assert FIXTURE.stat().st_size < 1_000_000


@pytest.mark.gpu
def test_record_tiny_train_step(tmp_path):
    # The foreach AdamW allocates temporaries in its step, so every phase holds entries (the fused one allocates none).
    cfg = WorkloadConfig("tiny", 128, "train", optimizer="adamw-foreach")
    result = record_memory(cfg, steps=1, warmup=1, output_dir=tmp_path)
    assert result.snapshot_path == tmp_path / "tiny_ctx128_train.pickle"
    assert result.sidecar_path == tmp_path / "tiny_ctx128_train.json" and result.oom is None
    check_recording(result.snapshot_path)
    check_self_describing(result.snapshot_path)


@pytest.mark.gpu
def test_cli_writes_pickle_sidecar_plot_and_json(tmp_path):
    args = ["memory", "--model", "tiny", "--ctx", "64", "--mode", "forward", "--mixed-precision",
            "--output-dir", str(tmp_path), "--format", "json", "--top", "4"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["config"]["mixed_precision"] and len(data["top_allocations"]) == 4
    stem = tmp_path / "tiny_ctx64_forward_bf16"
    assert all(stem.with_suffix(s).exists() for s in (".pickle", ".json", ".png", ".html"))


@pytest.mark.gpu
def test_oom_inside_the_recorded_step_still_dumps(tmp_path):
    # 1.5 GiB holds the small model (0.5 GB of fp32 weights), not a ctx-1024 step (GBs of activations).
    args = ["memory", "--model", "small", "--ctx", "1024", "--mode", "train", "--memory-limit-gib", "1.5",
            "--output-dir", str(tmp_path), "--no-plot", "--format", "json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1
    assert "Error: out of memory in" in result.stderr and "saved anyway" in result.stderr
    data = json.loads(result.stdout)
    assert data["oom"]["phase"] in phases_for("train") and data["oom_events"]
    side = json.loads((tmp_path / "small_ctx1024_train.json").read_text())
    assert any(not p["completed"] for p in side["phases"]) and side["oom"]["phase"] in phases_for("train")
