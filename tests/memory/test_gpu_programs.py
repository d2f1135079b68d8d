"""`profiler-kit memory --` on programs of its own on GPUs: DDP and FSDP2 under torchrun on 2 GPUs (each rank's
roles at its peak against what the rank says it holds, and the merged view), and an unannotated program with
activation checkpointing and gradient accumulation on one GPU (its peak named by step and phase, as many forwards
and backwards as micro-batches)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "examples"
TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")


def _record(tmp_path: Path, name: str, command: list[str]) -> tuple[list[dict], str]:
    """Run `memory -o tmp/name --format json -- command`: the JSON documents it printed and its stderr."""
    run = subprocess.run([sys.executable, "-m", "profiler_kit", "memory", "-o", str(tmp_path / name), "--format",
                          "json", "--", *command], capture_output=True, text=True, cwd=ROOT, timeout=900,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr[-4000:]
    return [json.loads(doc) for doc in run.stdout.replace("}\n{", "}\n\x00{").split("\x00")], run.stderr


def _lines(stderr: str, key: str) -> list[dict]:
    return [json.loads(line)[key] for line in stderr.splitlines() if line.startswith(f'{{"{key}"')]


def _roles(report: dict) -> dict[str, dict]:
    return {row["role"]: row for row in report["roles_at_peak"]}


@pytest.mark.gpu
@pytest.mark.gpu_slow
@pytest.mark.multi_gpu
@TWO_GPUS
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_sharded_memory_per_rank_on_two_gpus(tmp_path, parallel):
    """Each rank's parameters at its peak are its local shards (the whole model under DDP) within 1%, its
    optimizer state AdamW's two fp32 moments of them within 1%, at most 5% of its bytes are unknown; FSDP2's
    all-gathered parameters and DDP's buckets have their own roles; the merged view covers both ranks."""
    docs, stderr = _record(tmp_path, parallel, [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                "--nproc-per-node", "2",
                                                str(EXAMPLES / "memory_sharded.py"), "--parallel", parallel])
    held = {h["rank"]: h for h in _lines(stderr, "held")}
    *reports, merged = docs
    assert len(reports) == 2 and sorted(held) == [0, 1]
    for report in reports:
        rank = int(re.search(r"\.rank(\d+)\.pickle$", report["snapshot"]).group(1))
        roles = _roles(report)
        assert roles["parameter"]["size_bytes"] == pytest.approx(held[rank]["parameter_bytes"], rel=0.01)
        assert roles["optimizer state"]["size_bytes"] == pytest.approx(2 * held[rank]["parameter_fp32_bytes"],
                                                                       rel=0.01)
        assert roles["unknown"]["share_pct"] <= 5.0, roles["unknown"]
        if parallel == "ddp":
            # One set of buckets holds every gradient once more; in step 1 two sets: DDP rebuilds its buckets in
            # that step's forward and frees the set it made at construction only in step 2's (torch 2.11).
            sets = 2 if report["peak"]["step"] == 1 else 1
            assert roles["gradient bucket"]["size_bytes"] == pytest.approx(sets * held[rank]["parameter_bytes"],
                                                                           rel=0.01)
        else:
            assert roles["unsharded parameter"]["size_bytes"] > 0
        assert re.match(r"step \d+, ", report["peak"]["phase"]), report["peak"]
    assert [r["rank"] for r in merged["ranks"]] == [0, 1]
    assert merged["highest_rank"] in (0, 1)


@pytest.mark.gpu
@pytest.mark.gpu_slow
def test_an_unannotated_program_has_its_peak_named_by_step_and_phase(tmp_path):
    (report,), stderr = _record(tmp_path, "accumulate", [sys.executable, str(EXAMPLES / "memory_accumulate.py")])
    (loop,) = _lines(stderr, "loop")
    steps, micro = loop["steps"], loop["micro_batches"]
    phases = report["phases"]
    assert sum(p["name"].split(", ")[-1].startswith("forward") for p in phases) == steps * micro
    assert sum(p["name"].split(", ")[-1].startswith("backward") for p in phases) == steps * micro
    assert len(report["peaks_by_step"]) == steps
    last = report["peaks_by_step"][-1]["step"]
    assert report["peak"]["phase"] == f"step {last}, backward #{micro}"
    assert report["peak"]["step"] == last
