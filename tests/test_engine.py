"""Where a job's reports are analysed: a real two-process Dask LocalCluster (`--scheduler local`) and the local
pool of `-j` give the same merged job; a report that cannot be read is named and the others merged; without
dask.distributed, `--scheduler` is refused in one line."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from click.testing import CliRunner

from profiler_kit.cli import main

KERNELS = Path(__file__).resolve().parent / "fixtures" / "kernels"


def job(tmp_path: Path) -> list[Path]:
    """Three ranks copied from the 2-rank gloo recording, and a fourth whose report is not JSON."""
    paths = []
    for rank in range(3):
        paths.append(tmp_path / f"job.rank{rank}.json.gz")
        shutil.copy(KERNELS / f"cpu_ddp2_gloo.rank{rank % 2}.json.gz", paths[-1])
    paths.append(tmp_path / "job.rank3.json.gz")
    paths[-1].write_bytes(b"not a trace")
    return paths


def summarized(*args: object) -> dict:
    result = CliRunner().invoke(main, ["kernels", "summarize", *map(str, args), "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_a_local_cluster_and_the_local_pool_merge_the_same_job(tmp_path):
    paths = job(tmp_path)
    pooled = summarized(*paths, "-j", "2")
    clustered = summarized(*paths, "-j", "2", "--scheduler", "local")
    assert clustered == pooled
    assert [r["rank"] for r in pooled["ranks"]] == [0, 1, 2]
    assert [(f["rank"], f["path"]) for f in pooled["failed"]] == [(3, str(paths[-1]))]
    # Each rank's figures, the same as the recording's own rank gives.
    alone = summarized(KERNELS / "cpu_ddp2_gloo.rank0.json.gz", KERNELS / "cpu_ddp2_gloo.rank1.json.gz")
    for rank in pooled["ranks"]:
        assert rank["categories"] == alone["ranks"][rank["rank"] % 2]["categories"]


def test_the_scheduler_without_dask_distributed_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # its import fails
    result = CliRunner().invoke(main, ["kernels", "summarize", *map(str, job(tmp_path)[:2]), "--scheduler",
                                       "local"])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        "Error: --scheduler needs dask.distributed, which is not installed: pip install 'profiler-kit[dask]'"]
