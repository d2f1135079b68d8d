"""Re-run the GPU figures that README.md and docs/ show, store their rows, and rewrite the figures from the rows.

Each part runs commands on one GPU and writes their rows to docs/data/results/PART.jsonl, every row stamped with
the commit, date, GPU, driver, torch and Triton versions, the command and the part's wall time. The parts run in
parallel, one per GPU of the machine (each in processes that see that GPU alone, `CUDA_VISIBLE_DEVICES`, and
an equal share of the CPU cores), the longest first, each GPU taking the next part when it is free; a part that
fails is reported and the others go on. Then every block `<!-- results:NAME -->...<!-- /results -->` in
README.md, docs/*.md and docs/results/*.md is rewritten from the stored rows by its renderer (`results_pages.py`,
`results_benchmark.py`), so no figure in them is typed by hand.

    PYTHONPATH=$PWD python3 tools/results.py                  # every part, on every GPU, then render
    PYTHONPATH=$PWD python3 tools/results.py --only leaderboard,attention-d128 --gpus 0,1
    PYTHONPATH=$PWD python3 tools/results.py --render         # only rewrite the blocks from the stored rows
    PYTHONPATH=$PWD python3 tools/results.py --list           # the parts, their commands and durations

`make results [ONLY=PART,...|render]` does the same. Run `. .gpu/setup.sh` first: the nsys parts need $NSYS.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import results_pages as pages  # noqa: E402  (the renderers, beside this file)
from results_benchmark import BENCHMARK_RENDERERS  # noqa: E402

PAGES = ("README.md", "docs/*.md", "docs/results/*.md")
BLOCK = re.compile(r"(<!-- results:([\w.-]+) -->)(.*?)(<!-- /results -->)", re.DOTALL)

REPO = pages.REPO
LOGS = REPO / "results" / "logs"  # git ignores results/


@dataclass(frozen=True)
class Run:
    """One command of a part. kind: `rows` (a profiler-kit command given `--output FILE`, whose rows are read
    back), `memory` (`profiler-kit memory`'s JSON report, one row), `nsys` (`profiler-kit nsys`'s JSON summary,
    one row), `script` (a Python tool given `--output FILE`)."""

    args: tuple[str, ...]
    kind: str = "rows"

    def text(self) -> str:
        return ("python3 " if self.kind == "script" else "profiler-kit ") + " ".join(self.args)


@dataclass(frozen=True)
class Part:
    """Commands whose rows make one data file, run one after another on one GPU."""

    runs: tuple[Run, ...]
    minutes: float  # about, on one H100; the stored rows' measured time replaces it once a run has stored them


TRAIN = ("benchmark", "--ctx", "512", "--mode", "train", "--mixed-precision", "--attention", "flash,sdpa")
GRAPHS = (*TRAIN, "--compile", "--cuda-graphs", "--warmup", "3", "--max-warmup", "15")
MODELS = ("xl", "2.7B")
ATTENTION = ("attention", "bench", "--dtype", "bf16")
LEADERBOARD = (*ATTENTION, "--impl", "flash-triton,sdpa-flash,sdpa-cudnn,sdpa-efficient", "--batch", "1",
               "--heads", "16", "--seq", "16384", "--d", "64", "--causal")
MEMORY = ("memory", "--model", "xl", "--ctx", "256", "--mode", "train", "--mixed-precision")
D128 = (*ATTENTION, "--impl", "flash-triton,sdpa-cudnn,sdpa-flash", "--batch", "4", "--heads", "16", "--d", "128")
STEADINESS = ("benchmark", "--ctx", "256", "--mode", "forward,train", "--mixed-precision")
NSYS = ("nsys", "--format", "json", "--top", "100000", "--force")
NSYS_2_7B = (*NSYS, "--model", "2.7B", "--ctx", "512", "--batch-size", "4", "--mode", "train", "--mixed-precision",
             "--compile", "--cuda-graphs", "--attention", "flash")

PARTS: dict[str, Part] = {
    "leaderboard": Part((Run(LEADERBOARD),), 2),
    "attention-d128": Part((Run((*D128, "--seq", "4096", "--causal")), Run((*D128, "--seq", "8192", "--no-causal"))),
                           3),
    "train-step": Part((Run((*TRAIN, "--optimizer", "adamw-fused,adamw-master", "--model", "xl,2.7B")),), 3),
    **{f"train-step-graphs-{m}-{o}": Part((Run((*GRAPHS, "--optimizer", f"adamw-{o}", "--model", m)),), 3)
       for m in MODELS for o in ("fused", "master")},
    # The optimizer beside the backward, and the plain compiled script after it on the same GPU.
    **{f"train-step-overlap-{m}": Part((Run((*GRAPHS, "--optimizer", "adamw-master", "--optimizer-overlap", "--model",
                                             m)),
                                        Run(("tools/plain_step.py", "--model", m, "--ctx", "512", "--batch-size", "4"),
                                            "script")), 5)
       for m in MODELS},
    "optimizers": Part((Run(("benchmark", "--model", "xl", "--ctx", "512", "--mode", "train", "--mixed-precision",
                             "--attention", "sdpa", "--optimizer", "adamw-fused,adamw-foreach")),), 2),
    "memory-xl": Part(tuple(Run((*MEMORY, "--optimizer", o), "memory") for o in ("adamw-fused", "adamw-foreach")), 3),
    "steadiness": Part((Run((*STEADINESS, "--model", "small,medium,large,xl,2.7B", "--repeat", "2")),), 4),
    "host-cpu": Part((Run(("benchmark", "--model", "xl", "--ctx", "256", "--mode", "forward,train",
                           "--mixed-precision", "--attention", "sdpa", "--steps", "20")),), 1),
    **{f"steadiness-compiled-{'-'.join(ms)}": Part((Run((*STEADINESS, "--compile", "--cuda-graphs", "--model",
                                                         ",".join(ms))),), 3)
       for ms in (("small", "medium"), ("large", "xl"))},
    "nsys-2.7B": Part(tuple(Run((*NSYS_2_7B, "--optimizer", o), "nsys") for o in ("adamw-fused", "adamw-master")),
                      5),
    "nsys-idle": Part((Run((*NSYS, "--model", "tiny", "--ctx", "128"), "nsys"),
                       Run((*NSYS, "--model", "xl", "--ctx", "256", "--mixed-precision"), "nsys"),
                       Run((*NSYS, "--model", "xl", "--ctx", "1024", "--batch-size", "4", "--mode", "forward",
                            "--mixed-precision", "--attention", "sdpa"), "nsys")), 3),
}


# ------------------------------------------------------------------------------------------------ one part


def stamp(commit: str | None = None) -> dict:
    """What every row of this run records: the commit (given, or git's HEAD with -dirty when tracked files differ),
    date, torch and Triton versions; the GPU and driver are the part's (`gpu_stamp`)."""
    if commit is None:
        git = lambda *a: subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True).stdout.strip()  # noqa: E731
        commit = git("rev-parse", "--short=10", "HEAD") + ("-dirty" if git("status", "--porcelain", "-uno") else "")
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {"commit": commit or None, "date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "triton": triton_version}


def gpu_stamp(env: dict[str, str]) -> dict:
    """The name and driver of the GPU a part's processes see (`nvidia-smi` of its CUDA_VISIBLE_DEVICES); None
    each without one."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    query = ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]
    try:
        done = subprocess.run(query + ([f"--id={visible}"] if visible else []), capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return {"gpu": None, "driver": None}
    first = done.stdout.strip().splitlines()[:1] if done.returncode == 0 else []
    name, _, driver = first[0].partition(", ") if first else ("", "", "")
    return {"gpu": name or None, "driver": driver or None}


def run_part(name: str, base: dict, env: dict[str, str] | None = None, log: Path | None = None) -> list[dict]:
    """Every row of part `name`, run now in processes with `env` (their output appended to `log`), each row with
    `base`, its GPU, its command and the part's wall time."""
    env = {**os.environ, **(env or {}),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    part, rows, start = PARTS[name], [], time.monotonic()
    where = {**base, **gpu_stamp(env)}
    for run in part.runs:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "rows.jsonl"
            if run.kind in ("rows", "script"):
                extra = ["--output", str(out)]
            elif run.kind == "memory":
                extra = ["--output-dir", tmp, "--no-html", "--no-plot", "--format", "json"]
            else:
                extra = ["--output-dir", tmp]
            command = ([sys.executable, *run.args] if run.kind == "script"
                       else [sys.executable, "-m", "profiler_kit", *run.args])
            say(f"{name}: {run.text()}")
            with open(log or os.devnull, "a") as sink:
                done = subprocess.run([*command, *extra], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=sink,
                                      text=True)
                sink.write(done.stdout)
            if done.returncode != 0 or (run.kind in ("rows", "script") and not out.is_file()):
                raise RuntimeError(f"{name}: `{run.text()}` exited with status {done.returncode}")
            if run.kind in ("rows", "script"):
                found = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
            elif run.kind == "memory":
                found = [pages.memory_row(json.loads(done.stdout), run.args)]
            else:
                found = [pages.nsys_row(json.loads(done.stdout), run.args)]
            rows += [{**row, **where, "command": run.text()} for row in found]
    seconds = time.monotonic() - start
    return [{**row, "part_seconds": round(seconds, 1)} for row in rows]


# ------------------------------------------------------------------------------------------------ many parts


def minutes(name: str) -> float:
    """How long part `name` takes: its stored rows' measured time, else the estimate."""
    path = pages.DATA / f"{name}.jsonl"
    if path.is_file():
        first = path.read_text().splitlines()[:1]
        seconds = json.loads(first[0]).get("part_seconds") if first else None
        if seconds:
            return seconds / 60
    return PARTS[name].minutes


def cpu_shares(gpus: Sequence[str], cores: Sequence[int]) -> dict[str, list[int]]:
    """The CPU cores each GPU's parts may use: equal, disjoint shares (every core when they are fewer than the
    GPUs)."""
    share = len(cores) // len(gpus)
    if share == 0:
        return {gpu: list(cores) for gpu in gpus}
    return {gpu: list(cores[i * share:(i + 1) * share]) for i, gpu in enumerate(gpus)}


def run_parallel(names: Sequence[str], gpus: Sequence[str], run: Callable[[str, str], None],
                 duration: Callable[[str], float] = minutes) -> dict[str, str | None]:
    """Run every part, longest first, on one worker per GPU that takes the next part whenever it is free;
    `run(name, gpu)` does one. Returns each part's error (None: done); one failing does not stop the others."""
    todo: queue.Queue[str] = queue.Queue()
    for name in sorted(names, key=duration, reverse=True):
        todo.put(name)
    errors: dict[str, str | None] = {}
    lock = threading.Lock()

    def worker(gpu: str) -> None:
        while True:
            try:
                name = todo.get_nowait()
            except queue.Empty:
                return
            try:
                run(name, gpu)
                error = None
            except Exception as exc:  # a part's failure is its own: report it, run the rest
                error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            with lock:
                errors[name] = error

    threads = [threading.Thread(target=worker, args=(gpu,), name=f"gpu{gpu}") for gpu in gpus]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {name: errors[name] for name in names}


def visible_gpus() -> list[str]:
    """This machine's GPUs as CUDA_VISIBLE_DEVICES names them (its own list when set), else their indices."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return [g.strip() for g in visible.split(",") if g.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def run_all(names: Sequence[str], gpus: Sequence[str], base: dict) -> dict[str, str | None]:
    """Every part on the GPUs, each part's rows written as soon as it is done, each part's output logged."""
    LOGS.mkdir(parents=True, exist_ok=True)
    cores = cpu_shares(gpus, sorted(os.sched_getaffinity(0)))
    started = time.monotonic()

    def one(name: str, gpu: str) -> None:
        threads = str(len(cores[gpu]))
        env = {"CUDA_VISIBLE_DEVICES": gpu, "OMP_NUM_THREADS": threads, "TORCHINDUCTOR_COMPILE_THREADS": threads}
        log = LOGS / f"{name}.log"
        log.write_text("")
        with affinity(cores[gpu]):
            rows = run_part(name, base, env, log)
        pages.write_rows(name, rows)
        say(f"{name}: done on GPU {gpu} in {rows[0]['part_seconds'] if rows else 0:.0f} s "
            f"({time.monotonic() - started:.0f} s into the run)")

    return run_parallel(names, gpus, one)


class affinity:
    """Processes this thread starts inside the block run on `cores` (on Linux the affinity set for pid 0 is the
    calling thread's, and a child inherits it from the thread that starts it)."""

    def __init__(self, cores: Sequence[int]) -> None:
        self.cores = set(cores)

    def __enter__(self) -> None:
        self.before = os.sched_getaffinity(0)
        os.sched_setaffinity(0, self.cores)

    def __exit__(self, *exc) -> None:
        os.sched_setaffinity(0, self.before)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def renderers() -> dict[str, Callable[[], str]]:
    """Every block's renderer by name."""
    return {
        "leaderboard": pages.render_leaderboard,
        "attention-d128": pages.render_attention_d128,
        "leaderboard-table": pages.render_leaderboard_table,
        "attention-d128-table": pages.render_attention_d128_table,
        "memory": pages.render_memory,
        "measured": pages.measured_all,
        "measured-attention": pages.measured(("leaderboard", "attention-d128")),
        "benchmark-environment": pages.render_benchmark_environment,
        **BENCHMARK_RENDERERS,
    }


def render_text(text: str) -> str:
    """`text` with every results block rewritten by its renderer; a part without rows says how to measure it."""
    known = renderers()

    def replace(match: re.Match) -> str:
        name = match.group(2)
        if name not in known:
            raise SystemExit(f"Error: unknown results block {name!r}; known: {', '.join(known)}")
        try:
            body = known[name]()
        except pages.NotMeasured as missing:
            body = f"not measured yet: `make results ONLY={missing.args[0]}`"
        return match.group(1) + body + match.group(4)

    return BLOCK.sub(replace, text)


def render() -> list[Path]:
    """Rewrite every results block in the pages; return the pages that changed."""
    changed = []
    for pattern in PAGES:
        for page in sorted(REPO.glob(pattern)):
            text = page.read_text()
            new = render_text(text)
            if new != text:
                page.write_text(new)
                changed.append(page)
    return changed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help=f"comma-separated parts to run: {', '.join(PARTS)} (default: all)")
    parser.add_argument("--render", action="store_true", help="only rewrite the blocks from the stored rows")
    parser.add_argument("--list", action="store_true", help="print the parts, their commands and durations")
    parser.add_argument("--gpus", help="comma-separated GPUs to run parts on, as CUDA_VISIBLE_DEVICES names them "
                        "(default: every GPU of the machine)")
    parser.add_argument("--commit", help="the commit the code being measured is (default: git's HEAD); for a copy "
                        "of the tree whose git metadata is not the tree's")
    args = parser.parse_args(argv)
    if args.list:
        for name, part in PARTS.items():
            print(f"{name} (about {minutes(name):.1f} min on one H100):")
            for run in part.runs:
                print(f"    {run.text()}")
        return
    failed: dict[str, str | None] = {}
    if not args.render:
        names = args.only.split(",") if args.only else list(PARTS)
        unknown = [n for n in names if n not in PARTS]
        if unknown:
            parser.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
        gpus = args.gpus.split(",") if args.gpus else visible_gpus()
        if not gpus:
            raise SystemExit("Error: no GPU to run the parts on (--gpus, or a machine with CUDA devices)")
        say(f"{len(names)} parts on GPUs {', '.join(gpus)}, about {sum(map(minutes, names)):.0f} GPU-minutes")
        failed = {name: error for name, error in run_all(names, gpus, stamp(args.commit)).items() if error}
    for page in render():
        say(f"rewrote {page.relative_to(REPO)}")
    for name, error in failed.items():
        say(f"Error: part {name} failed: {error} (its output: {(LOGS / name).with_suffix('.log')})")
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
