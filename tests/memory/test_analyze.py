"""Snapshot analysis on snapshots built like the CUDA caching allocator builds them: the allocated/reserved
timeline against the simulator's ground truth (also when the trace starts mid-run or its ring buffer dropped
events), the peak and what is alive at it, frames outside torch, phases, roles, expected vs measured sizes,
the report, the plot and `memory summarize`."""

import json
import pickle
import random

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from profiler_kit.cli import main
from profiler_kit.errors import ProfilerKitError
from profiler_kit.memory import analyze, plot_timeline, reconstruct
from profiler_kit.memory.analyze import BEFORE_TRACE, first_user_frame, short_path
from profiler_kit.memory.evidence import allocation_marks
from profiler_kit.memory.phases import place_phases
from profiler_kit.memory.roles import assign_roles
from profiler_kit.memory.snapshot import SIDECAR_FORMAT, SIDECAR_VERSION
from profiler_kit.memory.tables import expected_vs_measured, parameter_tensor_count
from profiler_kit.model import TransformerLM
from profiler_kit.presets import from_name

SEGMENT_BYTES = 2 * 1024**2  # the allocator's smallest large-pool segment
BLOCK_ROUND = 512  # block sizes are rounded up to this
TORCH_LINEAR = {"filename": "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", "line": 125,
                "name": "forward"}
TORCH_MODULE = {"filename": "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", "line": 1750,
                "name": "_call_impl"}
CPP_FRAME = {"filename": "/pytorch/aten/src/ATen/native/cuda/Blas.cpp", "line": 300, "name": "at::native::mm"}


def user_frame(name: str, line: int, filename: str = "/work/main/profiler_kit/model.py") -> dict:
    return {"filename": filename, "line": line, "name": name}


def round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class FakeAllocator:
    """A caching allocator in miniature: one block per segment, freed segments are reused (so addresses
    repeat), every event is logged the way torch logs it, and the true allocated/reserved bytes after each
    logged event are kept as ground truth. `max_entries` keeps only the newest entries, like torch's ring
    buffer."""

    def __init__(self, max_entries: int | None = None) -> None:
        self.segments: list[dict] = []  # {"address", "total_size", "block": addr or None}
        self.live: dict[int, tuple[int, list]] = {}
        self.trace: list[dict] = []
        self.truth_allocated: list[int] = []
        self.truth_reserved: list[int] = []
        self.recording = False
        self.max_entries = max_entries
        self.time_us = 1_700_000_000_000_000
        self.next_address = 0x7F00_0000_0000

    def _log(self, action: str, addr: int, size: int, frames: list) -> None:
        self.time_us += 7
        if not self.recording:
            return
        self.trace.append({"action": action, "addr": addr, "size": size, "stream": 0, "time_us": self.time_us,
                           "frames": list(frames)})
        self.truth_allocated.append(sum(s for s, _ in self.live.values()))
        self.truth_reserved.append(sum(seg["total_size"] for seg in self.segments))

    def tick(self) -> int:
        """A wall-clock reading between events (a phase boundary)."""
        self.time_us += 3
        return self.time_us

    def alloc(self, size: int, frames: list) -> int:
        seg = next((s for s in self.segments if s["block"] is None and s["total_size"] >= size), None)
        if seg is None:
            seg = {"address": self.next_address, "total_size": round_up(size, SEGMENT_BYTES), "block": None}
            self.next_address += seg["total_size"]
            self.segments.append(seg)
            self._log("segment_alloc", seg["address"], seg["total_size"], frames)
        seg["block"] = seg["address"]
        self.live[seg["address"]] = (size, frames)
        self._log("alloc", seg["address"], size, frames)
        return seg["address"]

    def free(self, addr: int) -> None:
        size, frames = self.live[addr]
        self._log("free_requested", addr, size, frames)
        del self.live[addr]
        next(s for s in self.segments if s["address"] == addr)["block"] = None
        self._log("free_completed", addr, size, frames)

    def empty_cache(self) -> None:
        for seg in [s for s in self.segments if s["block"] is None]:
            self.segments.remove(seg)
            self._log("segment_free", seg["address"], seg["total_size"], [])

    def snapshot(self) -> dict:
        segments = []
        for seg in self.segments:
            blocks = []
            if seg["block"] is not None:
                size, frames = self.live[seg["block"]]
                blocks.append({"address": seg["address"], "size": round_up(size, BLOCK_ROUND),
                               "requested_size": size, "state": "active_allocated", "frames": frames})
            used = sum(b["size"] for b in blocks)
            if used < seg["total_size"]:
                blocks.append({"address": seg["address"] + used, "size": seg["total_size"] - used,
                               "requested_size": 0, "state": "inactive", "frames": []})
            segments.append({
                "device": 0, "address": seg["address"], "total_size": seg["total_size"],
                "allocated_size": used, "active_size": used, "requested_size": used, "stream": 0,
                "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
                "blocks": blocks,
            })
        keep = self.max_entries or len(self.trace)
        return {"segments": segments, "device_traces": [self.trace[-keep:]],
                "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""}}

    def truth(self) -> tuple[np.ndarray, np.ndarray]:
        keep = self.max_entries or len(self.trace)
        return np.array(self.truth_allocated[-keep:]), np.array(self.truth_reserved[-keep:])


def random_workload(seed: int, events: int, record_from: int, max_entries: int | None = None
                    ) -> FakeAllocator:
    rng = random.Random(seed)
    fake = FakeAllocator(max_entries)
    for i in range(events):
        fake.recording = i >= record_from
        if fake.live and rng.random() < 0.45:
            fake.free(rng.choice(sorted(fake.live)))
        elif rng.random() < 0.03:
            fake.empty_cache()
        else:
            frames = [TORCH_LINEAR, user_frame("forward", rng.randrange(500))]
            fake.alloc(rng.randrange(1, 9 * 1024**2), frames)
    return fake


@pytest.mark.parametrize("record_from, max_entries", [(0, None), (150, None), (150, 400)])
def test_timeline_matches_the_allocators_truth(record_from, max_entries):
    fake = random_workload(seed=record_from + (max_entries or 0), events=600, record_from=record_from,
                           max_entries=max_entries)
    recon = reconstruct(fake.snapshot())
    allocated, reserved = fake.truth()
    np.testing.assert_array_equal(recon.allocated_bytes, allocated)
    np.testing.assert_array_equal(recon.reserved_bytes, reserved)
    assert recon.peak_allocated_bytes == max(allocated.max(), recon.initial_allocated_bytes)
    assert recon.peak_reserved_bytes >= reserved.max()


def test_an_address_allocated_again_ends_the_allocation_whose_free_was_not_logged():
    fake = FakeAllocator()
    fake.recording = True
    first = fake.alloc(5000, [])
    fake.free(first)
    second = fake.alloc(3000, [])  # the freed segment is reused: same address
    assert second == first
    dropped = next(i for i, e in enumerate(fake.trace) if e["action"] == "free_completed")
    del fake.trace[dropped], fake.truth_allocated[dropped], fake.truth_reserved[dropped]
    recon = reconstruct(fake.snapshot())
    reuse = next(i for i, e in enumerate(fake.trace) if e["action"] == "alloc" and e["size"] == 3000)
    assert recon.allocated_bytes[reuse] == fake.truth_allocated[reuse] == 3000
    assert list(recon.allocations["end"]) == [reuse, recon.n_entries]


def test_peak_lists_what_is_alive_including_allocations_older_than_the_trace():
    fake = FakeAllocator()
    workload = user_frame("__init__", 97, "/work/main/profiler_kit/workload.py")
    params = fake.alloc(3000, [TORCH_MODULE, workload])
    leftover = fake.alloc(700, [TORCH_LINEAR, user_frame("forward", 60)])
    fake.recording = True
    a = fake.alloc(1500, [TORCH_LINEAR, user_frame("forward", 104)])
    b = fake.alloc(2500, [CPP_FRAME, TORCH_LINEAR, user_frame("forward", 121)])
    fake.free(leftover)
    fake.free(a)
    c = fake.alloc(100, [user_frame("forward", 130)])
    fake.free(b)
    fake.free(c)
    report = analyze(fake.snapshot(), top=10)
    recon = report.recon
    assert recon.peak_allocated_bytes == 3000 + 700 + 1500 + 2500
    assert recon.initial_allocated_bytes == 3000 + 700
    top = report.top.set_index("size_bytes")
    assert list(report.top["size_bytes"]) == [3000, 2500, 1500, 700]
    assert top.loc[2500, "where"] == "profiler_kit/model.py:121" and top.loc[2500, "function"] == "forward"
    assert top.loc[3000, "where"] == "profiler_kit/workload.py:97"  # frames from the segments' block
    assert top.loc[3000, "allocated_in"] == top.loc[700, "allocated_in"] == "before trace"
    assert pd.isna(top.loc[700, "where"])  # freed in the trace, allocated before it: no allocation frames
    assert any("'where' is empty" in note for note in report.notes)
    alive = recon.allocations.set_index("addr")
    assert alive.loc[params, "start"] == BEFORE_TRACE and alive.loc[params, "alive_at_end"]


def test_no_trace_means_the_snapshot_state_is_the_peak():
    fake = FakeAllocator()
    fake.alloc(4096, [user_frame("forward", 1)])
    fake.alloc(1024, [user_frame("forward", 2)])
    report = analyze(fake.snapshot())
    assert report.recon.n_entries == 0 and report.recon.peak_index == BEFORE_TRACE
    assert report.recon.peak_allocated_bytes == 4096 + 1024
    assert report.recon.peak_reserved_bytes == 2 * SEGMENT_BYTES
    assert any("no trace" in note for note in report.notes)
    with pytest.raises(ProfilerKitError, match="no trace"):
        plot_timeline(report.recon, report.roles, report.spans, "unused.png", "t")


def test_first_frame_outside_torch_skips_cpp_and_torch_frames():
    model_frame = user_frame("forward", 104)
    assert first_user_frame([CPP_FRAME, TORCH_LINEAR, TORCH_MODULE, model_frame, user_frame("step", 3)]) \
        is model_frame
    assert first_user_frame([CPP_FRAME, TORCH_LINEAR]) is None
    assert first_user_frame([]) is None
    assert short_path("/venv/lib/python3.11/site-packages/einops/einops.py") == "einops/einops.py"
    assert short_path("/work/main/profiler_kit/model.py") == "profiler_kit/model.py"


def test_device_choice():
    fake = random_workload(seed=1, events=50, record_from=0)
    snapshot = fake.snapshot()
    snapshot["device_traces"] = [[], snapshot["device_traces"][0]]
    for seg in snapshot["segments"]:
        seg["device"] = 1
    assert reconstruct(snapshot).device == 1
    with pytest.raises(ProfilerKitError, match="no device 5"):
        reconstruct(snapshot, device=5)
    with pytest.raises(ProfilerKitError, match="nothing was on the GPU"):
        reconstruct({"segments": [], "device_traces": [[]]})


# A tiny model's train step in miniature: parameters and AdamW moments from before the recording, activations
# of the config's shapes in forward (at this ctx they outweigh the gradients), freed in backward, where the
# gradients appear, then an optimizer step with a small temporary.
CONFIG = {"model": "tiny", "ctx": 128, "mode": "train", "batch_size": 4, "mixed_precision": False}


def simulated_train_step() -> tuple[dict, dict, dict]:
    mc = from_name(CONFIG["model"], CONFIG["ctx"])
    b, t = CONFIG["batch_size"], CONFIG["ctx"]
    param_sizes = [p.numel() * 4 for p in TransformerLM(mc).parameters()]
    fake = FakeAllocator()
    workload = user_frame("__init__", 97, "/work/main/profiler_kit/workload.py")
    params = [fake.alloc(s, [TORCH_MODULE, workload]) for s in param_sizes]
    moments = [fake.alloc(s, [user_frame("step", 130, "/work/main/profiler_kit/workload.py")])
               for s in param_sizes for _ in range(2)]
    fake.recording = True
    counts = {"residual": 2 * mc.num_layers + 1, "scores": 3 * mc.num_layers}
    phases = []
    activations = [fake.alloc(b * t * mc.d_model * 4, [TORCH_LINEAR, user_frame("forward", 140)])
                   for _ in range(counts["residual"])]
    activations += [fake.alloc(b * mc.num_heads * t * t * 4, [user_frame("naive_causal_attention", 33)])
                    for _ in range(counts["scores"])]
    phases.append({"step": 0, "phase": "forward", "end_time_us": fake.tick()})
    for addr in activations:
        fake.free(addr)
    grads = [fake.alloc(size, []) for size in param_sizes]  # the autograd engine's thread: no Python frames
    phases.append({"step": 0, "phase": "backward", "end_time_us": fake.tick()})
    temp = fake.alloc(min(param_sizes), [user_frame("step", 130, "/work/main/profiler_kit/workload.py")])
    fake.free(temp)
    phases.append({"step": 0, "phase": "optimizer_step", "end_time_us": fake.tick()})
    for p in phases:
        p.update(peak_allocated_bytes=0, peak_reserved_bytes=0, allocated_bytes=0, completed=True)
    sidecar = {
        "format": SIDECAR_FORMAT, "version": SIDECAR_VERSION, "config": dict(CONFIG, device="auto"),
        "phases": phases, "max_entries": 100_000, "oom": None, "peak_allocated_bytes": 1,
        "peak_reserved_bytes": 1,
        "tensor_roles": {"parameter": params, "gradient": grads, "adamw_state": moments},
    }
    return fake.snapshot(), sidecar, counts


def test_phases_roles_and_expected_vs_measured():
    snapshot, sidecar, counts = simulated_train_step()
    report = analyze(snapshot, sidecar, top=5)
    spans = report.spans
    assert [s.label for s in spans] == ["step 0, forward", "step 0, backward", "step 0, optimizer_step"]
    assert spans[0].start == 0 and spans[-1].end == report.recon.n_entries
    assert report.summary.loc[0, "peak_phase"] == "step 0, forward"  # activations all alive, no gradients yet
    assert set(report.top["allocated_in"]) <= {"step 0, forward", "before trace"}
    n_tensors = len(sidecar["tensor_roles"]["parameter"])
    assert parameter_tensor_count(from_name("tiny").num_layers) == n_tensors  # the formula matches the model
    rows = expected_vs_measured(report.recon, assign_roles(report.recon, spans, sidecar), CONFIG).set_index("tensor")
    assert rows.loc["parameters", "count_at_peak"] == rows.loc["parameters", "expected_count"] == n_tensors
    assert rows.loc["AdamW state (exp_avg, exp_avg_sq)", "count_at_peak"] == 2 * n_tensors
    assert rows.loc["gradients", "count_at_peak"] == 0
    assert rows.loc["gradients", "allocs_in_trace"] == n_tensors
    assert rows.loc["B·T·d activations (residual stream)", "count_at_peak"] == counts["residual"]
    assert rows.loc["attention scores B·h·T²", "count_at_peak"] == counts["scores"]
    assert rows.loc["logits B·T·V", "count_at_peak"] == 0
    mc = from_name("tiny")
    params_mib = rows.loc["parameters", "total_at_peak_mib"]
    assert params_mib == pytest.approx(rows.loc["parameters", "expected_total_mib"])
    b, t = CONFIG["batch_size"], CONFIG["ctx"]
    assert rows.loc["attention scores B·h·T²", "bytes_each"] == b * mc.num_heads * t * t * 4


def test_roles_without_the_recorders_list_come_from_phase_and_lifetime():
    snapshot, sidecar, counts = simulated_train_step()
    del sidecar["tensor_roles"]
    report = analyze(snapshot, sidecar)
    a, roles = report.recon.allocations, report.roles
    made_in = {span.phase: (a["start"] >= span.start) & (a["start"] < span.end) for span in report.spans}
    # Kept past forward: activations; made in backward and kept: gradients; the optimizer's scratch: temporary.
    assert set(roles[made_in["forward"]]) == {"activation"}
    n_tensors = parameter_tensor_count(from_name("tiny").num_layers)
    assert (roles[made_in["backward"]] == "gradient").sum() == n_tensors
    assert set(roles[made_in["optimizer_step"]]) == {"temporary"}
    # Parameters and moments were made before the trace with no stack that names them: matched by size to the
    # gradients made in backward, three blocks per gradient (AdamW), so the bytes of each role are exact.
    before = a["start"] == BEFORE_TRACE
    param_bytes = sum(p.numel() * 4 for p in TransformerLM(from_name("tiny", 128)).parameters())
    assert a.loc[before & (roles == "parameter"), "size_bytes"].sum() == param_bytes
    assert a.loc[before & (roles == "optimizer state"), "size_bytes"].sum() == 2 * param_bytes
    assert set(roles[before]) == {"parameter", "optimizer state"}
    by_role = report.roles_at_peak.set_index("role")
    assert by_role.loc["activation", "count"] == counts["residual"] + counts["scores"]
    assert by_role.loc["unknown", "count"] == 0
    assert "sized like a gradient" in by_role.loc["parameter", "evidence"]
    assert not any("role 'unknown'" in note for note in report.notes)


def test_mixed_precision_adds_bf16_rows():
    recon = reconstruct(simulated_train_step()[0])
    no_roles = pd.Series([None] * len(recon.allocations), dtype=object)
    rows = expected_vs_measured(recon, no_roles, dict(CONFIG, mixed_precision=True))
    assert (rows["count_at_peak"] == 0).all()  # nothing is matched by its size alone
    assert set(rows["dtype"]) == {"fp32", "bf16"}
    weights = rows[rows["tensor"].str.startswith("bf16 copies")].iloc[0]
    assert weights["expected_count"] == 5 * from_name("tiny").num_layers + 1


def write_snapshot(tmp_path, snapshot, sidecar=None, name="run"):
    path = tmp_path / f"{name}.pickle"
    path.write_bytes(pickle.dumps(snapshot, protocol=4))
    if sidecar is not None:
        (tmp_path / f"{name}.json").write_text(json.dumps(sidecar))
    return path


def test_summarize_cli_formats_and_plot(tmp_path):
    snapshot, sidecar, _ = simulated_train_step()
    path = write_snapshot(tmp_path, snapshot, sidecar)
    runner = CliRunner()
    result = runner.invoke(main, ["memory", "summarize", str(path), "--format", "json", "--top", "3"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    recon = reconstruct(snapshot)
    assert data["peak"]["allocated_bytes"] == recon.peak_allocated_bytes
    assert (data["peak"]["phase"], data["peak"]["step"]) == ("step 0, forward", 0)
    assert len(data["top_allocations"]) == 3 and data["config"]["model"] == "tiny"
    assert {r["tensor"] for r in data["expected_vs_measured"]} >= {"parameters", "gradients"}
    png = tmp_path / "timeline.png"
    args = ["memory", "summarize", str(path), "--format", "markdown", "--plot", str(png)]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    assert result.stdout.lstrip().startswith("### peak memory") and "| position |" in result.stdout
    assert "wrote" not in result.stdout and "wrote" in result.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size < 300_000


def test_summarize_without_metadata_or_ranges_has_no_phase_or_expected_tables(tmp_path):
    fake = random_workload(seed=3, events=200, record_from=50)
    path = write_snapshot(tmp_path, fake.snapshot())
    result = CliRunner().invoke(main, ["memory", "summarize", str(path)])
    assert result.exit_code == 0, result.output
    assert "largest" in result.stdout and "expected vs measured" not in result.stdout
    assert "peaks per phase" not in result.stdout
    assert "no phases" in result.stdout  # the table's caption holds the notes


def test_ranges_inside_outermost_ranges_of_one_name_are_the_phases_and_those_the_steps():
    fake = FakeAllocator()
    fake.recording = True
    notes = []

    def mark(stage, name, device=0):
        notes.append({"stage": stage, "name": name, "device": device, "time_us": fake.tick()})

    blocks = []
    for step in range(2):
        mark("START", "train_step")
        blocks.append(fake.alloc(1000 * (step + 1), [user_frame("forward", 1)]))
        mark("START", "inner")  # nested: part of train_step
        mark("START", "other device", device=1)
        scratch = fake.alloc(5000, [user_frame("forward", 2)])
        fake.free(scratch)
        mark("END", "inner")
        mark("END", "train_step")
        mark("START", "never closed")
    outside = fake.alloc(9000, [user_frame("step", 3)])
    fake.free(outside)
    snapshot = dict(fake.snapshot(), external_annotations=notes)
    report = analyze(snapshot)
    assert [s.label for s in report.spans] == ["step 0, inner", "step 1, inner"]
    assert report.placed.steps_from == "the 'train_step' ranges, which hold the phases"
    phases = report.to_json()["phases"]
    # Each range's peak holds what it inherited plus its own scratch; the larger allocation outside is not in it.
    assert [p["peak_allocated_bytes"] for p in phases] == [1000 + 5000, 1000 + 2000 + 5000]
    assert report.recon.peak_allocated_bytes == 1000 + 2000 + 9000
    assert report.summary.loc[0, "peak_phase"] == "after the steps"
    assert set(report.roles[report.recon.allocations["size_bytes"] == 5000]) == {"temporary"}


def test_autocast_weight_copies_are_told_from_a_linear_output_of_the_same_size():
    weight_numel = 1600 * 6400
    copy_bytes = 2 * weight_numel  # a bf16 copy of the weight; the bf16 logits below have exactly this size
    fake = FakeAllocator()
    fake.recording = True
    phases = []
    copies = [fake.alloc(copy_bytes, [TORCH_LINEAR, user_frame("forward", 112)]) for _ in range(2)]
    logits = fake.alloc(copy_bytes, [TORCH_LINEAR, user_frame("forward", 159)])
    phases.append({"step": 0, "phase": "forward", "end_time_us": fake.tick()})
    for addr in copies:  # released with the saved tensors of the backward
        fake.free(addr)
    phases.append({"step": 0, "phase": "backward", "end_time_us": fake.tick()})
    phases.append({"step": 0, "phase": "optimizer_step", "end_time_us": fake.tick()})
    fake.free(logits)  # the step's local variable goes when the step returns
    meta = {"config": {"mixed_precision": True}, "linear_weight_numels": [weight_numel], "phases": phases}
    recon = reconstruct(fake.snapshot())
    spans = place_phases(recon, fake.snapshot(), meta, allocation_marks(recon.allocations)).spans
    roles = dict(zip(recon.allocations["addr"], assign_roles(recon, spans, meta), strict=True))
    assert [roles[a] for a in copies] == ["autocast weight copy"] * 2
    assert roles[logits] == "activation"
    fp32_meta = dict(meta, config={"mixed_precision": False})  # no autocast, no copies
    assert "autocast weight copy" not in set(assign_roles(recon, spans, fp32_meta))
