"""The analysis on real snapshots recorded on an H100: the recorder's (with its sidecar) and one dumped by a plain
script (no sidecar, C++ and Python stacks, PyTorch's own `Optimizer.step#AdamW.step` range). Phases from
annotations against an independent replay of the trace, roles from stacks, the pickle alone against pickle +
sidecar, the offline HTML report, the role-stacked PNG and `memory compare`."""

import html
import json
import pickle
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from memory_replay import replay_levels, replay_range_peak

from profiler_kit.cli import main
from profiler_kit.memory import analyze, analyze_file, load_snapshot, report_html
from profiler_kit.memory.phases import annotation_ranges
from profiler_kit.memory.plot import ROLE_COLORS
from profiler_kit.memory.snapshot import EMBEDDED_KEY, load_metadata
from profiler_kit.memory.tables import parameter_tensor_count
from profiler_kit.model import TransformerLM
from profiler_kit.presets import count_parameters, from_name
from profiler_kit.render import format_cell

FIXTURES = Path(__file__).parents[1] / "fixtures" / "memory"
RECORDER = FIXTURES / "tiny_ctx128_train.pickle"
PLAIN = FIXTURES / "h100_tiny_train_snapshot.pickle"
# A plain script's snapshot with record_function ranges around its phases, and the allocator's peak counter read
# in each range (reset at its start); both recorded on the H100 (tests/fixtures/README.md says how).
PLAIN_PHASES = FIXTURES / "h100_plain_phases.pickle"
PLAIN_COUNTERS = FIXTURES / "h100_plain_phases_counters.json"
# A recording by this recorder in mixed precision: metadata and phase ranges inside the snapshot.
RECORDER_BF16 = FIXTURES / "tiny_ctx128_train_bf16.pickle"
TINY_PARAMS = count_parameters(from_name("tiny", 128))
# The allocator counts whole blocks (512 B rounding); the trace counts requested bytes. For the tiny model's many
# small tensors this reads up to about 2% higher.
COUNTER_SLACK = 0.03


def test_phases_of_a_plain_snapshot_come_from_its_annotations_and_match_a_replay():
    report = analyze_file(PLAIN)
    assert report.meta is None
    phases = report.to_json()["phases"]
    # PyTorch's own optimizer range is the one range the snapshot names, standing in for the optimizer step that
    # ends the step; forward and backward are inferred.
    assert [(p["name"], p["step"], p["source"]) for p in phases] == [
        ("step 0, forward", 0, "inferred"), ("step 0, backward", 0, "inferred"),
        ("step 0, optimizer_step", 0, "pytorch")]
    snapshot = load_snapshot(PLAIN)
    (name, start_us, end_us, _), = annotation_ranges(snapshot, 0)
    levels, times = replay_levels(snapshot)
    assert phases[2]["peak_allocated_bytes"] == replay_range_peak(levels, times, start_us, end_us)
    assert report.recon.peak_allocated_bytes == levels.max()


def model_parameter_sizes() -> list[int]:
    return sorted(p.numel() * 4 for p in TransformerLM(from_name("tiny", 128)).parameters())


def replay_truth(snapshot: dict) -> dict[str, list[tuple[int, int]]]:
    """(address, bytes) of the blocks a train loop keeps, by a replay of the trace that shares nothing with the
    analysis: `persistent` are the allocated blocks of the snapshot that no alloc entry of the trace made (alive
    since before the history began, never freed); `gradient` are the allocations that a `zero_grad` stack frees,
    and those made in the trace and still alive at the snapshot (the loop keeps nothing else across steps)."""
    live: dict[int, int] = {}
    grads = []
    for entry in snapshot["device_traces"][0]:
        if entry["action"] == "alloc":
            live[entry["addr"]] = entry["size"]
        elif entry["action"] == "free_completed":
            live.pop(entry["addr"], None)
            if any(f["name"] == "zero_grad" for f in entry.get("frames", [])):
                grads.append((entry["addr"], entry["size"]))
    blocks = [(b["address"], b["requested_size"]) for seg in snapshot["segments"] for b in seg["blocks"]
              if b["state"] == "active_allocated"]
    return {"persistent": [(addr, size) for addr, size in blocks if addr not in live],
            "gradient": grads + sorted(live.items())}


@pytest.mark.parametrize("path", [PLAIN, PLAIN_PHASES, RECORDER], ids=lambda p: p.stem)
def test_roles_of_a_snapshot_without_a_list_match_a_replay(path):
    """Parameters and AdamW state from their sizes against the gradients; gradients from their stacks; the bytes of
    each exactly what the tiny model and a replay of the trace say."""
    snapshot = load_snapshot(path)
    truth = replay_truth(snapshot)
    report = analyze(snapshot)  # no recorder metadata: no list, no recorder phases
    a, roles = report.recon.allocations, report.roles
    rows = {role: list(zip(a.loc[roles == role, "addr"], a.loc[roles == role, "size_bytes"], strict=True))
            for role in ("parameter", "optimizer state", "gradient")}
    sizes = model_parameter_sizes()
    steps = sum(1 for r in annotation_ranges(snapshot, 0) if r[0].startswith("Optimizer.step#"))
    assert sorted(size for _, size in truth["gradient"]) == sorted(sizes * (steps + 1))  # the replay's premise
    assert sorted(rows["gradient"]) == sorted(truth["gradient"])
    persistent = set(truth["persistent"])
    assert set(rows["parameter"]) <= persistent and set(rows["optimizer state"]) <= persistent
    assert sorted(size for _, size in rows["parameter"]) == sizes
    assert sorted(size for _, size in rows["optimizer state"]) == sorted(sizes * 2)
    assert report.summary.loc[0, "peak_phase"] == "step 0, backward"
    unknown = report.roles_at_peak.set_index("role").loc["unknown"]
    # Left unknown: two 32 MiB blocks (cuBLAS workspaces) and a few 4 KiB ones, none sized like a gradient.
    assert unknown["size_bytes"] < 64.1 * 2**20
    assert "no gradient of the trace has its size" in unknown["evidence"]


@pytest.mark.parametrize("path", [RECORDER, RECORDER_BF16], ids=lambda p: p.stem)
def test_without_the_list_the_roles_at_the_peak_are_those_of_the_recorders_list(path):
    """The recorder's own list of storages is the truth: without it, the bytes of every role at the peak are the
    same, the gradients are the listed ones and parameters with optimizer state are the listed blocks."""
    snapshot = load_snapshot(path)
    meta = load_metadata(path, snapshot)[0]
    listed = analyze(snapshot, meta)
    unlisted_meta = {k: v for k, v in meta.items() if k != "tensor_roles"}
    inferred = analyze({k: v for k, v in snapshot.items() if k != EMBEDDED_KEY}, unlisted_meta)
    # The fused AdamW of the bf16 run keeps each parameter's step as a 4-byte tensor on the GPU, which the old list
    # left out and the inference counts as optimizer state.
    counters = [b["requested_size"] for seg in snapshot["segments"] for b in seg["blocks"]
                if b["state"] == "active_allocated" and b["requested_size"] == 4]
    assert len(counters) in (0, len(meta["tensor_roles"]["parameter"]))
    expected = listed.roles_at_peak.drop(columns=["evidence", "size_mib", "share_pct"]).set_index("role")
    expected.loc["optimizer state"] += [len(counters), sum(counters)]
    expected.loc["unknown"] -= [len(counters), sum(counters)]
    pd.testing.assert_frame_equal(
        inferred.roles_at_peak.drop(columns=["evidence", "size_mib", "share_pct"]).set_index("role"), expected)
    # The expected-vs-measured table counts the moments alone: the same with and without the list.
    pd.testing.assert_frame_equal(listed.expected, inferred.expected)
    a = inferred.recon.allocations
    lists = meta["tensor_roles"]
    alive = a[a["alive_at_end"]]
    assert set(alive.loc[inferred.roles == "gradient", "addr"]) == set(lists["gradient"])
    state = alive.loc[inferred.roles.isin(["parameter", "optimizer state"]), "addr"]
    assert set(lists["parameter"]) | set(lists["adamw_state"]) <= set(state)
    assert set(listed.evidence[listed.roles == "parameter"]) == {
        "in the recorder's list of parameter storages taken at the snapshot"}


def test_the_peak_phase_is_inferred_where_the_recorder_placed_it():
    """The recorder's fixture analysed without its sidecar names no phase but PyTorch's optimizer range: the
    inferred phases put the peak in the backward, where the recorder's own phase times (read here from the
    sidecar and placed on the trace's clock) put it."""
    report = analyze_file(RECORDER, use_sidecar=False)
    assert report.meta is None and report.summary.loc[0, "peak_phase"] == "step 0, backward"
    sidecar = json.loads(RECORDER.with_suffix(".json").read_text())
    ends = {p["phase"]: p["end_time_us"] for p in sidecar["phases"]}
    peak_time = load_snapshot(RECORDER)["device_traces"][0][report.recon.peak_index]["time_us"]
    assert ends["forward"] < peak_time <= ends["backward"]
    inferred = {s.phase: s for s in report.spans if s.source == "inferred"}
    assert set(inferred) == {"forward", "backward"}
    times = report.recon.time_us
    assert times[inferred["backward"].start] > ends["forward"]
    assert times[inferred["backward"].end - 1] <= ends["backward"]


def test_the_pickle_alone_analyses_like_pickle_and_sidecar(tmp_path):
    snapshot = load_snapshot(RECORDER)
    sidecar = json.loads(RECORDER.with_suffix(".json").read_text())
    alone = tmp_path / RECORDER.name
    alone.write_bytes(pickle.dumps(dict(snapshot, **{EMBEDDED_KEY: sidecar}), protocol=4))
    a, b = analyze_file(RECORDER).to_json(), analyze_file(alone).to_json()
    assert (a.pop("metadata_source"), b.pop("metadata_source")) == ("sidecar", "snapshot")
    a.pop("snapshot"), b.pop("snapshot")
    assert a == b
    assert [p["name"] for p in a["phases"]] == ["step 0, forward", "step 0, backward", "step 0, optimizer_step"]


def test_recorder_phases_replayed_against_its_counters():
    report = analyze_file(RECORDER)
    for phase in report.to_json()["phases"]:
        counter = phase["counter_peak_allocated_mib"]
        assert phase["peak_allocated_mib"] <= counter <= (1 + COUNTER_SLACK) * phase["peak_allocated_mib"]
    rows = report.expected.set_index("tensor")
    assert rows.loc["parameters", "bytes_per_param_at_peak"] == 4
    assert rows.loc["AdamW state (exp_avg, exp_avg_sq)", "bytes_per_param_at_peak"] == 8


def test_html_report_is_self_contained_and_holds_the_tables(tmp_path):
    out = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["memory", "summarize", str(RECORDER), "--html", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    report = analyze_file(RECORDER)
    assert text == report_html(report)
    assert f"{report.recon.peak_allocated_bytes:,}" in text and "<svg" in text and "<polygon" in text
    for _, df in report.tables():
        for row in df.itertuples(index=False):
            for value, column in zip(row, df.columns, strict=True):
                assert html.escape(format_cell(value, column), quote=True) in text
    # One stack per listed allocation, and nothing that would load from anywhere.
    assert text.count("<details>") == len(report.top)
    assert not re.search(r"<script|<link|<img|<iframe|<object|@import|url\(|\b(src|href)\s*=", text, re.I)
    assert re.findall(r"https?://[^\s<\"']+", text) == ["https://pytorch.org/memory_viz"]


def test_plot_is_stacked_by_role(tmp_path):
    png = tmp_path / "timeline.png"
    result = CliRunner().invoke(main, ["memory", "summarize", str(RECORDER), "--plot", str(png), "--format",
                                       "json"])
    assert result.exit_code == 0, result.output
    json.loads(result.stdout)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size < 300_000
    from matplotlib.image import imread

    pixels = (imread(png)[..., :3] * 255).round().astype(int).reshape(-1, 3)
    colors = {tuple(p) for p in np.unique(pixels, axis=0)}
    drawn = {role for role, hex_color in ROLE_COLORS.items()
             if tuple(int(hex_color[i:i + 2], 16) for i in (1, 3, 5)) in colors}
    # The roles this recording holds are drawn (the legend alone would show all roles present in the trace).
    assert {"parameter", "optimizer state", "activation", "gradient", "temporary"} <= drawn
    assert "autocast weight copy" not in drawn  # an fp32 run has none


def test_compare_side_by_side(tmp_path):
    runner = CliRunner()
    result = runner.invoke(main, ["memory", "compare", str(RECORDER), str(PLAIN), "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    a, b = analyze_file(RECORDER), analyze_file(PLAIN)
    peak = data["peaks"][0]
    assert peak["metric"] == "peak allocated"
    assert peak["a_mib"] * 2**20 == a.recon.peak_allocated_bytes and peak["b_mib"] * 2**20 == \
        b.recon.peak_allocated_bytes
    assert peak["delta_mib"] == pytest.approx(peak["b_mib"] - peak["a_mib"])
    phases = {p["phase"]: p for p in data["phases"]}
    # B's forward and backward are inferred, its optimizer step is PyTorch's range: all line up with A's recorded
    # phases, step by step.
    assert set(phases) == {"step 0, forward", "step 0, backward", "step 0, optimizer_step"}
    assert phases["step 0, backward"]["a_mib"] == phases["step 0, backward"]["b_mib"]
    roles = {r["role"]: r for r in data["roles_at_peak"]}
    assert roles["parameter"]["a_mib"] * 2**20 == roles["parameter"]["b_mib"] * 2**20 == 4 * TINY_PARAMS
    same = runner.invoke(main, ["memory", "compare", str(RECORDER), str(RECORDER), "--format", "markdown"])
    assert same.exit_code == 0 and same.stdout.startswith("### peaks")
    assert "| peak allocated |" in same.stdout and "| optimizer state |" in same.stdout


@pytest.mark.skipif(not PLAIN_PHASES.exists(), reason="recorded on the H100 by the GPU script")
def test_plain_script_phases_match_replay_and_counters():
    report = analyze_file(PLAIN_PHASES)
    counters = json.loads(PLAIN_COUNTERS.read_text())
    snapshot = load_snapshot(PLAIN_PHASES)
    levels, times = replay_levels(snapshot)
    outer = [r for r in annotation_ranges(snapshot, 0) if r[3] == 0]
    phases = report.to_json()["phases"]
    # The counters name the k-th run of each range `name #k` (from 1): here the phase of step k - 1.
    assert [p["name"] for p in phases] == [
        re.sub(r"(\w+) #(\d+)", lambda m: f"step {int(m[2]) - 1}, {m[1]}", c["name"]) for c in counters]
    for phase, counter, (_, start_us, end_us, _) in zip(phases, counters, outer, strict=True):
        assert phase["peak_allocated_bytes"] == replay_range_peak(levels, times, start_us, end_us)
        assert phase["peak_allocated_bytes"] <= counter["peak_allocated_bytes"]
        assert counter["peak_allocated_bytes"] <= (1 + COUNTER_SLACK) * phase["peak_allocated_bytes"]


@pytest.mark.skipif(not RECORDER_BF16.exists(), reason="recorded on the H100 by the GPU script")
def test_mixed_precision_recording_describes_itself():
    with_sidecar = analyze_file(RECORDER_BF16).to_json()
    alone = analyze_file(RECORDER_BF16, use_sidecar=False).to_json()
    assert (with_sidecar.pop("metadata_source"), alone.pop("metadata_source")) == ("sidecar", "snapshot")
    assert with_sidecar == alone
    rows = {r["tensor"]: r for r in alone["expected_vs_measured"]}
    copies = rows["bf16 copies of Linear weights (autocast)"]
    assert copies["allocs_in_trace"] == copies["expected_count"] == 5 * from_name("tiny").num_layers + 1
    assert rows["gradients"]["allocs_in_trace"] == parameter_tensor_count(from_name("tiny").num_layers)
