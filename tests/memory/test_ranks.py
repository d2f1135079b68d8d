"""Several ranks' snapshots: an FSDP2 program under `profiler-kit memory -- torchrun` on 2 CPU ranks (gloo, torch's
memory history calls faked inside the program, each rank's snapshot an H100 recording that rank 1 grows by a
transient allocation at its peak) records each rank's local shards and ends with the merged view; `memory
summarize` merges per-rank files given one by one, by their stem or by a glob; every column of the merged view
against its definition."""

import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from profiler_kit.cli import main
from profiler_kit.memory import analyze_file, load_snapshot
from profiler_kit.memory.analyze import MIB
from profiler_kit.memory.ranks import merge, rank_peak, snapshot_paths
from profiler_kit.memory.snapshot import EMBEDDED_KEY
from profiler_kit.recording import runner

FIXTURES = Path(__file__).parents[1] / "fixtures" / "memory"
WINDOW = FIXTURES / "h100_program_window.pickle"
PHASES = FIXTURES / "h100_plain_phases.pickle"
GROWTH = 64 * MIB

# Torch's memory history calls, replaced inside the program: the snapshot is the H100 recording, which rank R grows
# by R × GROWTH bytes made and freed right after its peak entry (with that entry's stack).
FAKES = f"""
import os, pickle, torch
import numpy as np
torch.cuda.synchronize = lambda *a: None
torch.cuda.get_device_name = lambda *a: "fake"
torch.cuda.memory._record_memory_history = lambda *a, **kw: None
with open({str(WINDOW)!r}, "rb") as f:
    SNAPSHOT = pickle.load(f)

def grown():
    trace = list(SNAPSHOT["device_traces"][0])
    sign = {{"alloc": 1, "free_completed": -1}}
    level = np.cumsum([sign.get(e["action"], 0) * e["size"] for e in trace])
    peak = trace[int(np.argmax(level))]
    size = int(os.environ["RANK"]) * {GROWTH}
    made = dict(peak, action="alloc", addr=1 << 50, size=size)
    gone = [dict(made, action=a) for a in ("free_requested", "free_completed")]
    at = int(np.argmax(level)) + 1
    return dict(SNAPSHOT, device_traces=[trace[:at] + ([made, *gone] if size else []) + trace[at:]])

torch.cuda.memory._snapshot = grown
"""

PROGRAM = """
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
for layer in (model[0], model[2]):
    fully_shard(layer)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters())

def step():
    model(torch.randn(4, 16)).sum().backward()
    opt.step()
    opt.zero_grad()

step()
torch.cuda.profiler.start()
step(); step()
torch.cuda.profiler.stop()
shards = sorted(p.to_local().numel() * 4 for p in model.parameters())
os.write(2, f"shards {dist.get_rank()} {' '.join(map(str, shards))}\\n".encode())  # one write: ranks never mix
dist.destroy_process_group()
"""


def _documents(stdout: str) -> list[dict]:
    return [json.loads(doc) for doc in stdout.replace("}\n{", "}\n\x00{").split("\x00")]


def test_an_fsdp2_program_is_recorded_per_rank_and_merged(tmp_path, monkeypatch):
    prog = tmp_path / "fsdp.py"
    prog.write_text("import sys\n" + FAKES + textwrap.dedent(PROGRAM))
    monkeypatch.setattr(runner, "cuda_device_present", lambda: True)  # the parent's check; the child fakes the rest
    out = tmp_path / "fsdp"
    result = CliRunner().invoke(main, ["memory", "-o", str(out), "--format", "json", "--", sys.executable, "-m",
                                       "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(prog)])
    assert result.exit_code == 0, result.stderr[-3000:]
    # Both ranks hold shards of the same sizes (the layers' dimensions are even).
    shards = sorted(int(n) for n in next(line for line in result.stderr.splitlines()
                                         if line.startswith("shards 0 ")).split()[2:])
    for rank in (0, 1):
        captures = load_snapshot(tmp_path / f"fsdp.rank{rank}.pickle")[EMBEDDED_KEY]["storages"]
        assert [c["label"] for c in captures] == ["window start", "optimizer step 1", "optimizer step 2"]
        for capture in captures:
            # Each rank lists its local shards (DTensor parameters), and AdamW's two moments of each.
            assert sorted(n for _, n in capture["parameter"]) == shards
            assert sorted(n for _, n in capture["optimizer_state"] if n != 4) == sorted(shards * 2)
            assert "note" not in capture
    *reports, merged = _documents(result.stdout)
    assert len(reports) == 2
    assert [r["rank"] for r in merged["ranks"]] == [0, 1]
    peaks = [r["peak_allocated_mib"] for r in merged["ranks"]]
    assert peaks[1] - peaks[0] == pytest.approx(GROWTH / MIB)
    assert (merged["highest_rank"], merged["lowest_rank"]) == (1, 0)
    grew = {row["role"]: row["delta_mib"] for row in merged["highest_by_role"]}
    assert grew["temporary"] == pytest.approx(GROWTH / MIB)  # made and freed in the phase of the peak
    assert any(n.startswith("rank 1 peaks highest") and "64.0 MiB (0.8%) above rank 0" in n and
               "temporary (+64.0 MiB)" in n for n in merged["notes"])


@pytest.fixture
def rank_files(tmp_path) -> Path:
    for rank, source in enumerate((WINDOW, PHASES)):
        shutil.copy(source, tmp_path / f"job.rank{rank}.pickle")
    return tmp_path / "job"


def test_summarize_merges_ranks_given_as_files_a_stem_or_a_glob(rank_files):
    files = [str(rank_files) + f".rank{r}.pickle" for r in (1, 0)]
    assert snapshot_paths(files) == [Path(f) for f in files]  # as given
    assert snapshot_paths([rank_files]) == snapshot_paths([str(rank_files) + ".rank*.pickle"]) == \
        [Path(f) for f in reversed(files)]  # by rank
    runner = CliRunner()
    docs = [json.loads(runner.invoke(main, ["memory", "summarize", *args, "--format", "json"]).stdout)
            for args in (files, [str(rank_files)])]
    assert docs[0] == docs[1]
    refused = runner.invoke(main, ["memory", "summarize", str(rank_files), "--plot", "x.png"])
    assert refused.exit_code == 2 and "--plot and --html draw one snapshot" in refused.stderr
    missing = runner.invoke(main, ["memory", "summarize", str(rank_files.with_name("nothing"))])
    assert missing.exit_code == 1 and "nor per-rank files" in missing.stderr


def test_every_column_of_the_merged_view_against_its_definition(rank_files):
    reports = [analyze_file(p) for p in snapshot_paths([rank_files])]
    merged = merge([rank_peak(r, i) for i, r in enumerate(reports)])
    table = merged.per_rank.set_index("rank")
    low = min(r.recon.peak_allocated_bytes for r in reports)
    for rank, report in enumerate(reports):
        row = table.loc[rank]
        assert row["peak_allocated_mib"] == report.recon.peak_allocated_bytes / MIB
        assert row["peak_reserved_mib"] == report.recon.peak_reserved_bytes / MIB
        assert row["above_lowest_mib"] == (report.recon.peak_allocated_bytes - low) / MIB
        assert row["peak_phase"] == report.summary.loc[0, "peak_phase"]
        for role, size in zip(report.roles_at_peak["role"], report.roles_at_peak["size_bytes"], strict=True):
            if size:
                assert row[f"{role.replace(' ', '_')}_mib"] == size / MIB
    high, lowest = reports[0], reports[1]  # the 8 GiB window recording against the tiny model's
    assert high.recon.peak_allocated_bytes > lowest.recon.peak_allocated_bytes
    hi = high.roles_at_peak.set_index("role")["size_bytes"]
    lo = lowest.roles_at_peak.set_index("role")["size_bytes"]
    for row in merged.highest.itertuples():
        assert row.size_mib == hi[row.role] / MIB
        assert row.share_pct == pytest.approx(100 * hi[row.role] / hi.sum())
        assert row.lowest_rank_mib == lo[row.role] / MIB
        assert row.delta_mib == (hi[row.role] - lo[row.role]) / MIB
    assert merged.highest["share_pct"].sum() == pytest.approx(100)
    # Two snapshots that name the same rank are numbered in the order given.
    twice = merge([rank_peak(reports[0], 0), rank_peak(reports[0], 1)])
    assert list(twice.per_rank["rank"]) == [0, 1]
    assert twice.notes[:2] == ["several snapshots name the same rank: they are numbered in the order given",
                               f"every rank peaks at {reports[0].recon.peak_allocated_bytes / MIB:,.1f} MiB "
                               "allocated"]
