"""Recording: a clear error without CUDA; on a GPU, a real recording (and the committed fixture made by one)
is a protocol-4 pickle whose trace agrees with the allocator's counters, whose phases land where their
allocations are, and whose model state matches the config; an OOM inside the recorded step still dumps."""

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from profiler_kit.cli import main
from profiler_kit.errors import ProfilerKitError
from profiler_kit.memory import analyze_file, load_snapshot, record, recorder
from profiler_kit.memory.analyze import first_user_frame
from profiler_kit.memory.recorder import oom_summary
from profiler_kit.presets import count_parameters, from_name
from profiler_kit.workload import PHASES, Workload, WorkloadConfig, phases_for

FIXTURE = Path(__file__).parents[1] / "fixtures" / "memory" / "tiny_ctx128_train.pickle"
# The allocator counts whole blocks (rounded up, and unsplit remainders below 1 MiB); the trace counts
# requested bytes. On a small model the two differ by well under this fraction.
ROUNDING_SLACK = 0.2
OOM_MESSAGE = "CUDA out of memory. Tried to allocate 9.00 GiB. GPU 0 has a total capacity of 79.19 GiB."


def test_cpu_device_is_refused_with_one_line():
    result = CliRunner().invoke(main, ["memory", "--model", "tiny", "--ctx", "16", "--device", "cpu"])
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith("Error: memory snapshots need a CUDA device")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_record_without_cuda_raises(tmp_path):
    with pytest.raises(ProfilerKitError, match="need a CUDA device"):
        record(WorkloadConfig("tiny", 16), output_dir=tmp_path)
    assert not any(tmp_path.iterdir())


def test_oom_summary_keeps_the_requested_size():
    message = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of "
               "which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.12 GiB memory "
               "in use.")
    assert oom_summary(RuntimeError(message)) == "Tried to allocate 2.00 GiB"


class FakeCudaAllocator:
    """Stands in for torch.cuda's allocator API on a CPU-only machine, so the recorder's control flow
    (warm-up outside the recording, history switched off whatever happens, protocol-4 dump, sidecar, OOM) runs
    here; the GPU tests below run the same flow against the real allocator."""

    def __init__(self, monkeypatch, oom_after_forward: bool) -> None:
        self.calls: list[str] = []
        self.history_on = False
        self.peak = 0
        mem = torch.cuda.memory
        for name, fn in [("reset_peak_memory_stats", self.reset), ("max_memory_allocated", self.read),
                         ("max_memory_reserved", self.read), ("memory_allocated", self.read),
                         ("get_device_name", lambda device=None: "Fake GPU")]:
            monkeypatch.setattr(torch.cuda, name, fn)
        monkeypatch.setattr(mem, "_record_memory_history", self.history)
        monkeypatch.setattr(mem, "_snapshot", self.snapshot)
        self.ranges: list[str] = []
        self.history_kwargs: dict = {}
        fake = self

        class Range:
            """Stands in for torch.profiler.record_function: logs when each range opens and closes."""

            def __init__(self, name):
                self.name = name

            def __enter__(self):
                fake.ranges.append(f"open {self.name}")

            def __exit__(self, *exc):
                fake.ranges.append(f"close {self.name}")

        monkeypatch.setattr(torch.profiler, "record_function", Range)
        monkeypatch.setattr(recorder, "require_cuda", lambda cfg: None)
        original = Workload.step

        def step(workload, on_phase_end=None):
            self.calls.append("step recorded" if self.history_on else "step unrecorded")

            def at_phase_end(phase):
                self.peak += 1000
                if on_phase_end:
                    on_phase_end(phase)
                if oom_after_forward and phase == "forward":
                    raise torch.cuda.OutOfMemoryError(OOM_MESSAGE)

            return original(workload, at_phase_end)

        monkeypatch.setattr(Workload, "step", step)

    def reset(self, device=None):
        self.peak = 0

    def read(self, device=None):
        return self.peak

    def history(self, enabled="all", **kwargs):
        self.history_on = enabled is not None
        self.history_kwargs = self.history_kwargs or kwargs
        self.calls.append(f"history {enabled} {kwargs.get('stacks')}")

    def snapshot(self):
        self.calls.append("snapshot")
        trace = [{"action": "alloc", "addr": 4096, "size": 512, "stream": 0, "time_us": 1},
                 {"action": "oom", "device_free": 10, "size": 9 << 30, "stream": 0, "time_us": 2}]
        block = {"address": 4096, "size": 512, "requested_size": 512, "state": "active_allocated"}
        return {"segments": [{"device": 0, "address": 4096, "total_size": 2 << 20, "blocks": [block]}],
                "device_traces": [trace]}


CPU_TINY = WorkloadConfig("tiny", 16, "train", batch_size=2, device="cpu")


def test_recorder_flow(monkeypatch, tmp_path):
    fake = FakeCudaAllocator(monkeypatch, oom_after_forward=False)
    result = record(CPU_TINY, steps=2, warmup=3, max_entries=1234, output_dir=tmp_path)
    assert fake.calls == ["step unrecorded"] * 3 + ["history all python"] + ["step recorded"] * 2 + \
        ["snapshot", "history None None"]
    assert result.snapshot_path.read_bytes()[:2] == b"\x80\x04"
    side = json.loads(result.sidecar_path.read_text())
    assert side == result.sidecar and side["max_entries"] == 1234 and side["oom"] is None
    assert [(p["step"], p["phase"]) for p in side["phases"]] == [(s, p) for s in (0, 1) for p in PHASES]
    assert [p["peak_allocated_bytes"] for p in side["phases"]] == [1000] * 6  # reset at every boundary
    (capture,) = side["storages"]
    assert capture["label"] == "the snapshot" and "time_us" not in capture  # stands for the snapshot's moment
    assert len(capture["parameter"]) == len(capture["gradient"]) == 7 * 2 + 3  # tiny has 2 layers
    # AdamW (fused, as the workload's default; on the CPU a plain tensor step): exp_avg, exp_avg_sq and the step.
    assert len(capture["optimizer_state"]) == 3 * len(capture["parameter"])
    assert all(size > 0 for _, size in capture["parameter"] + capture["gradient"])
    # The snapshot carries the same metadata, and each recorded phase ran inside a record_function range of its
    # name, collected from every thread.
    assert load_snapshot(result.snapshot_path)["profiler_kit"] == side
    assert fake.ranges == [f"{action} {p}" for _ in range(2) for p in PHASES for action in ("open", "close")]
    assert fake.history_kwargs["global_record_annotations"] is True
    assert len(side["linear_weight_numels"]) == 5 * 2 + 1


def test_oom_in_the_recorded_step_dumps_then_exits_nonzero(monkeypatch, tmp_path):
    fake = FakeCudaAllocator(monkeypatch, oom_after_forward=True)
    args = ["memory", "--model", "tiny", "--ctx", "16", "--batch-size", "2", "--device", "cpu",
            "--warmup", "2", "--output-dir", str(tmp_path), "--format", "json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1
    assert fake.calls == ["step unrecorded", "history all python", "step recorded", "snapshot",
                          "history None None"]
    assert result.stderr.strip().splitlines()[-1] == (
        "Error: out of memory in backward of recorded step 1 (Tried to allocate 9.00 GiB); the snapshot was "
        f"saved anyway: {tmp_path / 'tiny_ctx16_train.pickle'}")
    data = json.loads(result.stdout)
    assert data["oom"]["phase"] == "backward" and data["oom_events"][0]["requested_bytes"] == 9 << 30
    side = json.loads((tmp_path / "tiny_ctx16_train.json").read_text())
    assert side["warmup_oom"] == "Tried to allocate 9.00 GiB"
    assert [(p["phase"], p["completed"]) for p in side["phases"]] == [("forward", True), ("backward", False)]
    assert fake.ranges == ["open forward", "close forward", "open backward", "close backward"]
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
    assert [p["phase"] for p in side["phases"]] == list(phases_for(cfg["mode"])) * side["steps"]
    assert (1 - ROUNDING_SLACK) * side["peak_allocated_bytes"] <= recon.peak_allocated_bytes
    assert recon.peak_allocated_bytes <= side["peak_allocated_bytes"]
    # Phases are placed on the trace by time: each holds entries, and the trace's allocated bytes at each
    # phase end agree with the allocator's counter read there.
    assert len(report.spans) == len(side["phases"])
    for span, phase in zip(report.spans, side["phases"], strict=True):
        assert span.end > span.start
        measured = recon.allocated_at(span.end - 1)
        assert abs(measured - phase["allocated_bytes"]) <= ROUNDING_SLACK * phase["allocated_bytes"]
    # Forward and the optimizer run model code on the main thread; backward runs on the autograd engine's
    # thread, which has no Python frames. A misplaced boundary mixes the two.
    by_phase = {span.phase: _user_frame_share(report, span) for span in report.spans}
    assert by_phase["forward"] > 0.9
    if "backward" in by_phase:
        assert by_phase["backward"] < 0.5
    if "optimizer_step" in by_phase:
        assert by_phase["optimizer_step"] > 0.9
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
    assert set(phases_for(snapshot["profiler_kit"]["config"]["mode"])) <= names


@pytest.mark.skipif(not FIXTURE.exists(), reason="the H100 recording is committed by the lead")
def test_committed_h100_fixture():
    check_recording(FIXTURE)
    assert FIXTURE.stat().st_size < 1_000_000


@pytest.mark.gpu
def test_record_tiny_train_step(tmp_path):
    # The foreach AdamW allocates temporaries in its step, so every phase holds entries (the fused one allocates none).
    cfg = WorkloadConfig("tiny", 128, "train", optimizer="adamw-foreach")
    result = record(cfg, steps=1, warmup=1, output_dir=tmp_path)
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
    # 1.5 GiB holds the small model (0.5 GB of fp32 weights), not a ctx-1024 step (GBs of attention scores).
    limit_bytes = 1.5 * 1024**3
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(limit_bytes / torch.cuda.get_device_properties(0).total_memory)
    try:
        args = ["memory", "--model", "small", "--ctx", "1024", "--mode", "train",
                "--output-dir", str(tmp_path), "--no-plot", "--format", "json"]
        result = CliRunner().invoke(main, args)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()
    assert result.exit_code == 1
    assert "Error: out of memory in" in result.stderr and "saved anyway" in result.stderr
    data = json.loads(result.stdout)
    assert data["oom"]["phase"] in phases_for("train") and data["oom_events"]
    side = json.loads((tmp_path / "small_ctx1024_train.json").read_text())
    assert side["phases"][-1]["completed"] is False and side["warmup_oom"]
