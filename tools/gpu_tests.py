"""Run the GPU tests spread over the machine's GPUs: the selected tests are split into one group per GPU and
each group runs in its own pytest process that sees that GPU alone (`CUDA_VISIBLE_DEVICES`), all at once.

A test costs its measured time when an earlier run stored it (`results/gpu-test-seconds.json`, which each run
updates from pytest's per-test durations), else 1, or SLOW_WEIGHT when it is marked `gpu_slow`. A file's tests
stay together (module fixtures run once), unless the file alone costs more than a group's share: then it is cut
into consecutive runs of tests of about that share. The pieces go, costliest first, to the group with the least
so far. The output of each group goes to `results/gpu-tests/gpuN.log`; the summary says each group's result and
time, and the exit status is the first failing group's (0 when all pass).

    PYTHONPATH=$PWD python3 tools/gpu_tests.py -m gpu                 # every GPU test (`make test-gpu-all`)
    PYTHONPATH=$PWD python3 tools/gpu_tests.py -m "gpu and not gpu_slow" --gpus 0,1 tests/attention
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "results" / "gpu-tests"  # git ignores results/
SECONDS = REPO / "results" / "gpu-test-seconds.json"
SLOW_WEIGHT = 5


def collect(marker: str, paths: Sequence[str]) -> dict[str, list[str]]:
    """The selected test ids of each file."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", marker, *paths],
                          cwd=REPO, capture_output=True, text=True)
    if done.returncode not in (0, 5):  # 5: nothing selected
        raise SystemExit(f"Error: collecting the tests failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    files: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        if "::" in line and not line.startswith(" "):
            files.setdefault(line.split("::", 1)[0], []).append(line)
    return files


def costs(tests: list[str], slow: set[str], seconds: dict[str, float]) -> dict[str, float]:
    """Each test's expected time: its measured seconds if known, else 1, SLOW_WEIGHT for a slow one."""
    return {t: seconds[t] if t in seconds else SLOW_WEIGHT if t in slow else 1 for t in tests}


def pieces(files: dict[str, list[str]], cost: dict[str, float], groups: int) -> list[list[str]]:
    """Each file's tests as one piece, or, for a file costing more than a group's share, consecutive runs of its
    tests of about that share."""
    share = sum(cost.values()) / groups
    out = []
    for tests in files.values():
        piece, load = [], 0.0
        for test in tests:
            if piece and load + cost[test] > share:
                out.append(piece)
                piece, load = [], 0.0
            piece.append(test)
            load += cost[test]
        out.append(piece)
    return out


def split(parts: list[list[str]], cost: dict[str, float], groups: int) -> list[list[str]]:
    """Pieces into `groups` groups of about equal cost: the costliest first, each to the lightest group."""
    loads = [0.0] * groups
    out: list[list[str]] = [[] for _ in range(groups)]
    for piece in sorted(parts, key=lambda p: -sum(cost[t] for t in p)):
        i = loads.index(min(loads))
        out[i] += piece
        loads[i] += sum(cost[t] for t in piece)
    return [g for g in out if g]


def test_seconds(junit: Path) -> dict[str, float]:
    """Seconds per test id (`file::name`) from a pytest JUnit XML report."""
    return {f"{case.get('file')}::{case.get('name')}": float(case.get("time") or 0)
            for case in ElementTree.parse(junit).getroot().iter("testcase") if case.get("file")}


def run_groups(groups: list[list[str]], gpus: Sequence[str], marker: str, extra: Sequence[str]) -> list[dict]:
    """Group i in its own pytest process on GPU gpus[i] (a GPU may come more than once), all at once; their
    status, time and test seconds."""
    OUT.mkdir(parents=True, exist_ok=True)
    results: list[dict] = [{} for _ in groups]

    def one(i: int) -> None:
        gpu, name = gpus[i], f"gpu{gpus[i]}" + (f"-{gpus[:i].count(gpus[i])}" if gpus.count(gpus[i]) > 1 else "")
        with tempfile.TemporaryDirectory() as tmp:
            junit = Path(tmp) / "junit.xml"
            command = [sys.executable, "-m", "pytest", "-q", "-rs", "--durations=10", "-p", "no:cacheprovider",
                       "-m", marker, f"--junitxml={junit}", "-o", "junit_family=xunit1", *extra, *groups[i]]
            # The repository first, then what the caller put on PYTHONPATH (the nvtx package `.gpu/setup.sh` adds).
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu,
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
            start = time.monotonic()
            with open(OUT / f"{name}.log", "w") as log:
                status = subprocess.run(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
            found = test_seconds(junit) if junit.is_file() else {}
        results[i] = {"gpu": gpu, "log": OUT / f"{name}.log", "status": status, "seconds": time.monotonic() - start,
                      "tests": found}

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(groups))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", dest="marker", default="gpu", help="pytest marker expression (default: %(default)s)")
    parser.add_argument("--gpus", help="comma-separated GPUs as CUDA_VISIBLE_DEVICES names them (default: all)")
    parser.add_argument("--per-gpu", type=int, default=1, help="pytest processes per GPU (default: %(default)s); "
                        "2 on one GPU lets one group compile while the other runs kernels")
    parser.add_argument("paths", nargs="*", help="test files or folders (default: tests)")
    args, extra = parser.parse_known_args(argv)
    if args.gpus:
        gpus = args.gpus.split(",")
    elif os.environ.get("CUDA_VISIBLE_DEVICES"):
        gpus = os.environ["CUDA_VISIBLE_DEVICES"].split(",")
    else:
        import torch

        gpus = [str(i) for i in range(torch.cuda.device_count())] or ["0"]
    gpus = [gpu for gpu in gpus for _ in range(max(1, args.per_gpu))]
    paths = args.paths or ["tests"]
    files = collect(args.marker, paths)
    if not files:
        print("no test selected", file=sys.stderr)
        return 5
    slow = {test for tests in collect(f"({args.marker}) and gpu_slow", paths).values() for test in tests}
    stored = json.loads(SECONDS.read_text()) if SECONDS.is_file() else {}
    cost = costs([t for tests in files.values() for t in tests], slow, stored)
    groups = split(pieces(files, cost, len(gpus)), cost, len(gpus))
    print(f"{len(cost)} tests in {len(files)} files on GPUs {', '.join(gpus[:len(groups)])}",
          file=sys.stderr, flush=True)
    start = time.monotonic()
    results = run_groups(groups, gpus, args.marker, extra)
    SECONDS.parent.mkdir(parents=True, exist_ok=True)
    SECONDS.write_text(json.dumps({**stored, **{t: round(s, 2) for r in results for t, s in r["tests"].items()}},
                                  indent=1, sort_keys=True))
    for group, result in zip(groups, results, strict=True):
        verdict = "passed" if result["status"] == 0 else f"exit {result['status']}"
        print(f"GPU {result['gpu']}: {verdict} in {result['seconds']:.0f} s, {len(group)} tests "
              f"(log: {result['log']})")
    print(f"all groups done in {time.monotonic() - start:.0f} s")
    return next((r["status"] for r in results if r["status"] != 0), 0)


if __name__ == "__main__":
    sys.exit(main())
