"""`--parallel ddp|fsdp`: two gloo ranks under torchrun on the CPU (rows per rank, the aggregate row, scaling
efficiency, gradients really synchronized), and the aggregate arithmetic on its own."""

import gzip
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from profiler_kit import distributed, scaling
from profiler_kit.cli import main
from profiler_kit.workload import WorkloadConfig

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
BASELINE_TOKENS_PER_S = 1000.0


def torchrun(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([*TORCHRUN, *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)


def test_ddp_two_ranks_give_rows_per_rank_and_an_aggregate(tmp_path):
    baseline = tmp_path / "one_device.jsonl"
    config = WorkloadConfig("tiny", 32, "train", batch_size=2, device="cpu", nvtx=False)
    one = {**config.as_dict(), "status": "ok", "tokens_per_s": BASELINE_TOKENS_PER_S}
    baseline.write_text(json.dumps(one) + "\n")
    output = tmp_path / "rows.jsonl"
    proc = torchrun(["-m", "profiler_kit", "benchmark", "--model", "tiny", "--ctx", "32", "--batch-size", "2",
                     "--device", "cpu", "--no-nvtx", "--warmup", "1", "--steps", "2", "--parallel", "ddp",
                     "--baseline", str(baseline), "--output", str(output), "--format", "json"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout)["results"]  # rank 0 alone printed: one JSON document
    assert [r["rank"] for r in rows] == [0, 1, "all"]
    assert all(r["status"] == "ok" and r["parallel"] == "ddp" and r["world_size"] == 2 for r in rows)
    ranks, total = rows[:2], rows[2]
    assert total["total_ms"] == max(r["total_ms"] for r in ranks)
    assert total["tokens_per_s"] == pytest.approx(2 * 2 * 32 / (total["total_ms"] / 1e3))
    for row in rows:
        devices = 2 if row["rank"] == "all" else 1
        assert row["baseline_tokens_per_s"] == BASELINE_TOKENS_PER_S
        assert row["scaling_efficiency_pct"] == pytest.approx(
            row["tokens_per_s"] / (devices * BASELINE_TOKENS_PER_S) * 100)
    written = [json.loads(line) for line in output.read_text().splitlines()]
    assert [r["rank"] for r in written] == [0, 1, "all"]


def test_nsys_records_one_trace_per_rank(tmp_path):
    proc = torchrun(["-m", "profiler_kit", "nsys", "--backend", "torch", "--model", "tiny", "--ctx", "32",
                     "--batch-size", "2", "--device", "cpu", "--parallel", "fsdp", "--warmup", "1", "--steps", "1",
                     "--format", "json"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "phases" in json.loads(proc.stdout)  # rank 0's summary alone
    for rank in (0, 1):
        trace = json.loads(gzip.decompress((tmp_path / f"profiles/tiny_ctx32_train_fsdp.rank{rank}.json.gz")
                                           .read_bytes()))
        names = {event.get("name") for event in trace["traceEvents"]}
        assert {"gloo:all_gather", "gloo:all_reduce"} <= names, rank  # FSDP's gathers and gradient reductions


def test_gradients_are_synchronized(tmp_path):
    out = tmp_path / "sync.json"
    proc = torchrun([str(REPO / "tests" / "distributed" / "sync_check.py"), str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for mode, found in json.loads(out.read_text()).items():
        assert found["batches_differ"], mode
        # AdamW moves each weight by about its learning rate, 1e-4, in the sign of the gradient.
        assert found["moved"] > 5e-5, mode
        assert found["across_ranks"] == 0.0, mode
        assert found["vs_together"] < 1e-5, mode  # the step on both ranks' batches at once
        assert found["vs_alone"] > 5e-5, mode  # a step on this rank's batch alone is another step


# One gloo rank with DDP: the names of the process's threads before and after `leave`, from /proc.
LEAVE_CHECK = """
import gc, json, os, torch
from profiler_kit import distributed
def threads():
    return sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
distributed.join(torch.device("cpu"))
model = distributed.wrap(torch.nn.Linear(4, 4), "ddp", torch.device("cpu"))
model(torch.randn(2, 4)).sum().backward()
before = threads()
del model
gc.collect()
distributed.leave()
print(json.dumps([before, threads()]))
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads thread names from /proc")
def test_leave_stops_the_gloo_threads():
    """A process group that outlives `leave` keeps gloo's worker threads running into interpreter shutdown,
    where one releasing a tensor aborts the rank ("terminate called without an active exception")."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    proc = subprocess.run([sys.executable, "-c", LEAVE_CHECK], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    before, after = json.loads(proc.stdout)
    assert "pt_gloo_runloop" in before
    assert not any(name.startswith(("pt_gloo", "gloo")) for name in after), after


# One gloo rank of the built-in workload with FSDP2 and --mixed-precision: the dtype of a block's weight while its
# forward runs, and the dtypes of the sharded parameters and their gradients after a step.
FSDP_BF16_CHECK = """
import json, torch
from profiler_kit import distributed
from profiler_kit.workload import Workload, WorkloadConfig
w = Workload(WorkloadConfig("tiny", 16, "train", batch_size=2, mixed_precision=True, device="cpu", nvtx=False,
                            parallel="fsdp"))
seen = []
w.model.layers[0].register_forward_pre_hook(lambda m, a: seen.append(str(next(m.parameters()).dtype)))
w.step()
found = [seen, sorted({str(p.dtype) for p in w.model.parameters()}),
         sorted({str(p.grad.dtype) for p in w.model.parameters()})]
del w
distributed.leave()
print(json.dumps(found))
"""


def test_fsdp_mixed_precision_gathers_bf16_and_reduces_fp32():
    env = {**os.environ, "PYTHONPATH": str(REPO), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    proc = subprocess.run([sys.executable, "-c", FSDP_BF16_CHECK], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen, params, grads = json.loads(proc.stdout)
    assert seen == ["torch.bfloat16"] and params == ["torch.float32"] and grads == ["torch.float32"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_parallel_outside_torchrun_is_one_line_error(monkeypatch):
    for name in distributed.TORCHRUN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    result = CliRunner().invoke(main, ["benchmark", "--model", "tiny", "--ctx", "16", "--device", "cpu",
                                       "--parallel", "ddp"])
    assert result.exit_code != 0
    assert "torchrun" in result.output and "Traceback" not in result.output


def test_baseline_needs_parallel(tmp_path):
    baseline = tmp_path / "b.jsonl"
    baseline.write_text("")
    result = CliRunner().invoke(main, ["benchmark", "--model", "tiny", "--device", "cpu", "--baseline",
                                       str(baseline)])
    assert result.exit_code == 2 and "--baseline goes with --parallel" in result.output


def rank_row(rank: int, total_ms: float, **extra) -> dict:
    row = {"rank": rank, "world_size": 2, "status": "ok", "device": "cpu", "total_ms": total_ms,
           "forward_ms": total_ms / 2, "peak_allocated_mib": 100.0 + rank, "tokens_per_s": 64 / (total_ms / 1e3),
           "model_tflops": 1e-3 / total_ms, "message": ""}
    return {**row, **extra}


def test_aggregate_takes_the_slowest_rank():
    rows = [rank_row(0, 100.0), rank_row(1, 125.0)]
    total = scaling.aggregate_row(rows, tokens_per_rank_step=64, mixed_precision=False)
    assert total["rank"] == "all" and total["status"] == "ok"
    assert total["total_ms"] == 125.0 and total["forward_ms"] == 62.5 and total["peak_allocated_mib"] == 101.0
    assert total["tokens_per_s"] == pytest.approx(2 * 64 / 0.125)
    assert total["model_tflops"] == pytest.approx(2 * 1e-3 / 125.0)
    assert total["message"] == "slowest rank 1"


def test_aggregate_of_a_failed_rank_carries_its_status():
    rows = [rank_row(0, 100.0), rank_row(1, 100.0, status="oom", message="CUDA out of memory")]
    rows[1]["total_ms"] = rows[1]["tokens_per_s"] = None
    total = scaling.aggregate_row(rows, tokens_per_rank_step=64, mixed_precision=False)
    assert total["status"] == "oom" and total["message"] == "rank 1: CUDA out of memory"
    assert total["tokens_per_s"] is None and total["total_ms"] is None


def test_baseline_matches_the_config_without_parallel():
    cfg = WorkloadConfig("tiny", 32, "train", batch_size=2, device="cpu", parallel="ddp")
    keys = ("model", "ctx", "mode", "batch_size")
    rows = [
        {"model": "tiny", "ctx": 32, "mode": "train", "batch_size": 2, "status": "ok", "tokens_per_s": 900.0},
        {"model": "tiny", "ctx": "32", "mode": "train", "batch_size": "2", "status": "ok", "tokens_per_s": 1100.0},
        {"model": "tiny", "ctx": 64, "mode": "train", "batch_size": 2, "status": "ok", "tokens_per_s": 5.0},
        {"model": "tiny", "ctx": 32, "mode": "train", "batch_size": 2, "status": "oom", "tokens_per_s": None},
        {"model": "tiny", "ctx": 32, "mode": "train", "batch_size": 2, "status": "ok", "tokens_per_s": 7.0,
         "parallel": "ddp", "rank": 0},
    ]
    assert scaling.baseline_for(cfg, rows, keys) == pytest.approx(1000.0)
    assert scaling.baseline_for(cfg, rows[2:], keys) is None


def test_columns_place_the_rank_and_scaling_columns():
    cols = scaling.columns(["model", "device", "status", "tokens_per_s", "mfu_pct", "message"])
    assert cols == ["model", "parallel", "world_size", "rank", "device", "status", "tokens_per_s", "mfu_pct",
                    "baseline_tokens_per_s", "scaling_efficiency_pct", "message"]
