"""Sharded memory on 2 CPU ranks (torchrun, gloo): DDP and FSDP2 programs (`distributed_child.py`) run real steps
while every storage their operators make is logged with its Python stack. The recorder's list of storages names
each rank's local shards, their gradients and optimizer state, FSDP2's unsharded parameters while they exist and
DDP's buckets where the gradients are views of them; the stacks of the real steps carry the marks that name
unsharded parameters, gradient buckets and recomputation inside the backward; and the roles of a snapshot built
from those allocations follow."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from snapshot_program import Program

from profiler_kit.memory import analyze
from profiler_kit.memory.evidence import DDP_BUCKET, IN_BACKWARD, UNSHARDED, frame_marks
from profiler_kit.memory.storages import capture_storages

ROOT = Path(__file__).parents[2]
CHILD = Path(__file__).with_name("distributed_child.py")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("ranks")
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(CHILD), str(out)], capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def _marked(rows: list[dict], mark: str) -> list[dict]:
    return [r for r in rows if mark in frame_marks(r["frames"], False)]


def _without_counters(sizes: list[int]) -> list[int]:
    """AdamW's step counters are 4-byte scalar tensors beside its moments."""
    return [n for n in sizes if n != 4]


def test_fsdp2_parameters_are_listed_by_their_local_shards(ranks):
    for rank in ranks:
        fsdp = rank["fsdp"]
        shards = fsdp["local_shard_bytes"]
        for capture in fsdp["captures"]:
            assert capture["parameter"] == shards
            assert "note" not in capture
        after = fsdp["captures"][-1]
        # AdamW's exp_avg and exp_avg_sq of each shard, in fp32 like the shard, and a step counter per parameter.
        assert _without_counters(after["optimizer_state"]) == sorted(shards * 2)
        assert after["optimizer_state"].count(4) == len(shards)
        # The root keeps its parameters unsharded after forward: bf16 all-gather outputs, each a whole parameter;
        # after the backward every module is resharded again.
        assert fsdp["captures"][0]["unsharded_parameter"] == fsdp["unsharded_bf16_bytes"]
        assert after["unsharded_parameter"] == []


def test_ddp_buckets_are_listed_where_the_gradients_are_views_of_them(ranks):
    for rank in ranks:
        view, own = rank["ddp view=True"], rank["ddp view=False"]
        assert view["capture"]["gradient_bucket"] == [sum(view["parameter_bytes"])]  # one bucket holds them all
        assert view["capture"]["gradient"] == []
        assert own["capture"]["gradient_bucket"] == []  # the reducer's own buckets are out of Python's reach
        assert own["capture"]["parameter"] == own["parameter_bytes"]


def test_the_stacks_of_real_steps_name_buckets_unsharded_parameters_and_recomputation(ranks):
    for rank in ranks:
        ddp = rank["ddp view=False"]
        bucket = sum(ddp["parameter_bytes"])
        # DDP makes its bucket when it is built and again when it rebuilds it before the second forward; what else
        # its reducer makes there is scratch of a few bytes.
        marked = _marked(ddp["allocations"], DDP_BUCKET)
        assert [(r["phase"], r["bytes"]) for r in marked if r["bytes"] == bucket] == [("build", bucket),
                                                                                      ("forward 1", bucket)]
        assert all(r["bytes"] < 64 for r in marked if r["bytes"] != bucket)
        assert not any(r["phase"].startswith(("backward", "optimizer")) for r in marked)

        fsdp = rank["fsdp"]
        rows = fsdp["allocations"]
        unsharded = _marked(rows, UNSHARDED)
        per_block = sum(fsdp["unsharded_bf16_bytes"]) // 2  # two blocks of equal size, unpadded
        # Each parameter's all-gather output (the first time), and each block's flat all-gather output.
        sizes = sorted(r["bytes"] for r in unsharded if r["bytes"] != per_block)
        assert sizes == fsdp["unsharded_bf16_bytes"]
        assert all(r["phase"].startswith("forward") for r in unsharded)
        assert not any(UNSHARDED in frame_marks(r["frames"], False) for r in rows
                       if any(f["name"] == "foreach_reduce" for f in r["frames"]))
        # Activation checkpointing: the blocks' forward runs again inside the backward.
        recomputed = [r for r in rows if any(f["name"] == "forward" and f["filename"] == str(CHILD)
                                             for f in r["frames"])]
        assert recomputed
        for r in recomputed:
            assert (IN_BACKWARD in frame_marks(r["frames"], False)) == r["phase"].startswith("backward"), r


def _snapshot_of(rows: list[dict]) -> dict:
    """A snapshot whose trace makes each logged allocation with its real stack and keeps it."""
    program = Program("python")
    program.recording = True
    for row in rows:
        program.alloc(row["bytes"], row["frames"])
    return program.snapshot()


def test_roles_of_the_logged_allocations_follow_their_stacks(ranks):
    fsdp = ranks[0]["fsdp"]
    report = analyze(_snapshot_of(fsdp["allocations"]))
    roles = report.roles_at_peak.set_index("role")
    assert roles.loc["unsharded parameter", "size_bytes"] == sum(r["bytes"] for r in _marked(fsdp["allocations"],
                                                                                             UNSHARDED))
    ddp = ranks[0]["ddp view=False"]
    report = analyze(_snapshot_of(ddp["allocations"]))
    buckets = report.recon.allocations.loc[report.roles == "gradient bucket", "size_bytes"]
    assert sorted(buckets[buckets > 64]) == [sum(ddp["parameter_bytes"])] * 2


class _Broken:
    """An optimizer whose state cannot be read."""

    param_groups = [{"params": []}]

    @property
    def state(self):
        raise RuntimeError("Attempted to access the data pointer on an invalid python storage.")


def test_a_capture_never_raises_and_says_what_it_could_not_read():
    import torch

    model = torch.nn.Linear(4, 4)
    capture = capture_storages(model.parameters(), [_Broken()], "optimizer step 1", modules=[object()])
    assert sorted(n for _, n in capture["parameter"]) == [16, 64]
    assert capture["optimizer_state"] == []
    assert capture["note"] == ("1 tensors or objects could not be read and are not listed: RuntimeError: "
                               "Attempted to access the data pointer on an invalid python storage.")
