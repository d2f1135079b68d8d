"""Run the GPU tests over every GPU of the machine and write what came of it (`make test-gpu-all`).

The selected tests are cut into pieces (a file's tests together, unless the file alone costs more than a worker's
share: then consecutive runs of its tests of about that share) and queued, the costliest first. Each GPU has
`--per-gpu` workers (default 2, so that one compiles while the other runs kernels); a worker takes the next piece
whenever it is free and runs it in a pytest process that sees its GPU alone (`CUDA_VISIBLE_DEVICES`). Tests marked
`multi_gpu` need several GPUs: on a machine with two or more, one more worker runs them, beside the others, in
pytest processes that see every GPU. A test costs its measured seconds from tests/gpu_durations.json (each run
stores the times it measured there), else 1, or SLOW_WEIGHT when it is marked `gpu_slow`.

Each worker's output goes to results/gpu-tests/<worker>.log. results/gpu-tests/summary.json holds the commit, the
GPUs, how many tests passed, failed, errored and were skipped, the ids of those that failed or errored, and the
seconds; the last line printed says the same. The exit status is 0 when no piece failed, else the first failing
piece's pytest status.

    PYTHONPATH=$PWD python3 tools/gpu_tests.py -m gpu --commit $(git rev-parse --short HEAD)
    PYTHONPATH=$PWD python3 tools/gpu_tests.py -m "gpu and not gpu_slow" --gpus 0,1 tests/attention
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ElementTree
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "results" / "gpu-tests"  # git ignores results/
SECONDS = REPO / "tests" / "gpu_durations.json"
SLOW_WEIGHT = 5
MULTI_GPU = "multi_gpu"
OUTCOMES = ("passed", "failed", "error", "skipped")


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


def pieces(files: dict[str, list[str]], cost: dict[str, float], workers: int) -> list[list[str]]:
    """Each file's tests as one piece, or, for a file costing more than a worker's share, consecutive runs of its
    tests of about that share; the costliest piece first."""
    share = sum(cost.values()) / max(1, workers)
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
    return sorted(out, key=lambda p: -sum(cost[t] for t in p))


def outcomes(junit: Path) -> dict[str, tuple[str, float]]:
    """Each test id (`file::name`) of a pytest JUnit XML report: its outcome (OUTCOMES) and seconds."""
    found = {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        if not case.get("file"):
            continue
        tags = {child.tag for child in case}
        outcome = next((o for o in ("failure", "error", "skipped") if o in tags), "passed")
        found[f"{case.get('file')}::{case.get('name')}"] = ({"failure": "failed"}.get(outcome, outcome),
                                                            float(case.get("time") or 0))
    return found


@dataclass
class Worker:
    """One thread of pytest processes that see `devices` (CUDA_VISIBLE_DEVICES), logging to `name`.log."""

    name: str
    devices: str
    statuses: list[int] = field(default_factory=list)
    tests: dict[str, tuple[str, float]] = field(default_factory=dict)
    seconds: float = 0.0

    def run(self, pieces: queue.Queue, marker: str, extra: Sequence[str]) -> None:
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": self.devices,
               # The repository first, then what the caller put there (the nvtx package `.gpu/setup.sh` adds).
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        with open(OUT / f"{self.name}.log", "w") as log, tempfile.TemporaryDirectory() as tmp:
            while True:
                try:
                    piece = pieces.get_nowait()
                except queue.Empty:
                    return
                junit = Path(tmp) / "junit.xml"
                junit.unlink(missing_ok=True)
                command = [sys.executable, "-m", "pytest", "-q", "-rs", "--durations=5", "-p", "no:cacheprovider",
                           "-m", marker, f"--junitxml={junit}", "-o", "junit_family=xunit1", *extra, *piece]
                start = time.monotonic()
                log.write(f"$ CUDA_VISIBLE_DEVICES={self.devices} pytest {' '.join(piece)}\n")
                log.flush()
                self.statuses.append(subprocess.run(command, cwd=REPO, env=env, stdout=log,
                                                    stderr=subprocess.STDOUT).returncode)
                self.seconds += time.monotonic() - start
                if junit.is_file():
                    self.tests.update(outcomes(junit))


def run_workers(workers: list[Worker], queues: list[queue.Queue], marker: str, extra: Sequence[str]) -> None:
    """Every worker at once, each taking pieces from its queue until it is empty."""
    OUT.mkdir(parents=True, exist_ok=True)
    threads = [threading.Thread(target=w.run, args=(q, marker, extra)) for w, q in zip(workers, queues, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def gpu_names(gpus: Sequence[str]) -> list[str]:
    """The name of each GPU, from nvidia-smi (the GPU's id where it cannot tell)."""
    smi = shutil.which("nvidia-smi")
    names: dict[str, str] = {}
    if smi:
        done = subprocess.run([smi, "--query-gpu=index,name", "--format=csv,noheader"], capture_output=True,
                              text=True)
        names = dict(line.split(", ", 1) for line in done.stdout.splitlines() if ", " in line)
    return [names.get(gpu, f"GPU {gpu}") for gpu in gpus]


def commit_of(given: str | None) -> str:
    """The commit tested: as given, else the checkout's HEAD (`+changes` when tracked files differ from it)."""
    if given:
        return given
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    if head.returncode != 0:
        return "unknown"
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True).stdout.strip()
    return head.stdout.strip() + ("+changes" if dirty else "")


def summary_line(summary: dict) -> str:
    counts = ", ".join(f"{summary[o]} {o}" for o in OUTCOMES)
    machines = Counter(summary["gpus"])
    where = " + ".join(f"{n} × {name}" for name, n in machines.items())
    path = OUT / "summary.json"
    shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    return f"GPU tests: {counts} in {summary['seconds']:.0f} s on {where} at {summary['commit']} ({shown})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", dest="marker", default="gpu", help="pytest marker expression (default: %(default)s)")
    parser.add_argument("--gpus", help="comma-separated GPUs as CUDA_VISIBLE_DEVICES names them (default: all)")
    parser.add_argument("--per-gpu", type=int, default=2, help="workers per GPU (default: %(default)s): one "
                        "compiles while another runs kernels")
    parser.add_argument("--commit", help="the commit the summary names (default: the checkout's HEAD)")
    parser.add_argument("paths", nargs="*", help="test files or folders (default: tests)")
    args, extra = parser.parse_known_args(argv)
    if args.gpus:
        gpus = args.gpus.split(",")
    elif os.environ.get("CUDA_VISIBLE_DEVICES"):
        gpus = os.environ["CUDA_VISIBLE_DEVICES"].split(",")
    else:
        done = subprocess.run([shutil.which("nvidia-smi") or "nvidia-smi", "-L"], capture_output=True, text=True)
        gpus = [str(i) for i, _ in enumerate(done.stdout.splitlines())] or ["0"]
    paths = args.paths or ["tests"]
    files = collect(args.marker, paths)
    if not files:
        print("no test selected", file=sys.stderr)
        return 5
    slow = {t for tests in collect(f"({args.marker}) and gpu_slow", paths).values() for t in tests}
    multi = {t for tests in collect(f"({args.marker}) and {MULTI_GPU}", paths).values() for t in tests}
    stored = json.loads(SECONDS.read_text()) if SECONDS.is_file() else {}
    cost = costs([t for tests in files.values() for t in tests], slow, stored)
    workers = [Worker(f"gpu{gpu}-{k}", gpu) for gpu in gpus for k in range(max(1, args.per_gpu))]
    alone = {f: [t for t in tests if len(gpus) < 2 or t not in multi] for f, tests in files.items()}
    shared: queue.Queue = queue.Queue()  # every one-GPU worker takes from it
    for piece in pieces({f: t for f, t in alone.items() if t}, cost, len(workers)):
        shared.put(piece)
    queues = [shared] * len(workers)
    together = {f: [t for t in tests if t in multi] for f, tests in files.items()} if len(gpus) > 1 else {}
    if any(together.values()):
        workers.append(Worker("gpus-" + "-".join(gpus), ",".join(gpus)))
        queues.append(queue.Queue())
        for piece in pieces({f: t for f, t in together.items() if t}, cost, 1):
            queues[-1].put(piece)
    print(f"{len(cost)} tests in {len(files)} files, {len(workers)} workers on GPUs {', '.join(gpus)}",
          file=sys.stderr, flush=True)
    start = time.monotonic()
    run_workers(workers, queues, args.marker, extra)
    tests = {t: found for w in workers for t, found in w.tests.items()}
    SECONDS.write_text(json.dumps({**stored, **{t: round(s, 1) for t, (_, s) in tests.items()}}, indent=0,
                                  sort_keys=True) + "\n")
    for w in workers:
        failed = [s for s in w.statuses if s != 0]
        verdict = "passed" if not failed else f"exit {failed[0]}"
        print(f"{w.name}: {verdict} in {w.seconds:.0f} s, {len(w.statuses)} pieces (log: {OUT / w.name}.log)")
    counted = Counter(outcome for outcome, _ in tests.values())
    summary = {
        "commit": commit_of(args.commit),
        "date": datetime.date.today().isoformat(),
        "gpus": gpu_names(gpus),
        "marker": args.marker,
        **{o: counted[o] for o in OUTCOMES},
        "not_run": len(cost) - len(tests),
        "failures": sorted(t for t, (outcome, _) in tests.items() if outcome in ("failed", "error")),
        "seconds": round(time.monotonic() - start, 1),
        "workers": [{"name": w.name, "devices": w.devices, "pieces": len(w.statuses), "seconds": round(w.seconds, 1),
                     "statuses": w.statuses} for w in workers],
    }
    (OUT / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(summary_line(summary), flush=True)
    return next((s for w in workers for s in w.statuses if s != 0), 0)


if __name__ == "__main__":
    sys.exit(main())
