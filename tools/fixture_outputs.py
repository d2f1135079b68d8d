"""The report commands' outputs on every committed fixture report, stored under tests/fixtures/outputs/.

Each case runs one command in this process (`kernels summarize` as table and JSON, `kernels whatif`,
`kernels timeline`, `kernels compare` of representative pairs, `memory summarize` and `memory compare`) from
the repository root, tables at COLUMNS=120, and keeps its stdout and stderr; `kernels timeline` keeps the
trace it writes, gzipped. The JSON `environment` block (versions of the machine) is replaced by a fixed one.
tests/test_fixture_outputs.py compares fresh outputs to the stored ones byte for byte.

    python tools/fixture_outputs.py [--diff]   # list the cases that differ from the stored outputs
    python tools/fixture_outputs.py --write    # store every case's output again (after an intended change)

Run from anywhere with the project's python (on a machine without the installed package: PYTHONPATH=REPO).
`.nsys-rep` reports are read through the `.sqlite` export beside them, so their `.sqlite` is the case.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import gzip
import itertools
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parents[1]
OUTPUTS = REPO / "tests" / "fixtures" / "outputs"
KERNELS = "tests/fixtures/kernels"
WIDTH = "120"
# What stands in for the JSON `environment` block and for the folder a timeline is written to.
FIXED_ENVIRONMENT = {"profiler_kit": "fixed"}
OUT_DIR = "<out>"
STDERR_MARK = b"\n--- stderr ---\n"
# `nsys stats` reports of another kind than per-kernel totals: refused by `kernels summarize`.
NOT_KERNEL_REPORTS = ("cudaapisum", "mem_time_sum", "nvtxkernsum", "nvtx_kern_sum", "nvtxsum")


@dataclass(frozen=True)
class Case:
    """One command and the file its output is stored in (`name`); `trace` when the output is the trace that
    `kernels timeline -o` writes. Tables are stored as text, JSON documents and traces gzipped (they are the
    bulk of the bytes)."""

    name: str
    args: tuple[str, ...]
    trace: bool = False

    @property
    def zipped(self) -> bool:
        return self.trace or "json" in self.args

    @property
    def path(self) -> Path:
        return OUTPUTS / (self.name + (".gz" if self.zipped else ".txt"))


def _reports(folder: str, pattern: str) -> list[str]:
    return sorted(str(p.relative_to(REPO)) for p in (REPO / folder).glob(pattern))


def kernel_reports() -> list[str]:
    """Every committed kernel report `kernels summarize` reads: nsys exports, torch.profiler traces and
    `nsys stats` per-kernel tables."""
    files = (_reports(KERNELS, "*.sqlite") + _reports(KERNELS, "*.json.gz") + _reports(KERNELS, "*.csv")
             + _reports(KERNELS, "*.txt") + _reports("profiles/examples", "*.sqlite"))
    return [f for f in files if not any(kind in f for kind in NOT_KERNEL_REPORTS)]


def snapshots() -> list[str]:
    return _reports("memory_snapshots/examples", "*.pickle") + _reports("tests/fixtures/memory", "*.pickle")


def _stem(path: str) -> str:
    name = Path(path).name
    return name.split(".")[0] + ("_rank" + name.split(".rank")[1][0] if ".rank" in name else "")


def _timed(path: str) -> bool:
    """Whether a report has kernel timestamps and launches (what-if and timeline need them)."""
    return not path.endswith((".csv", ".txt")) and "cpu_" not in Path(path).name


def cases() -> list[Case]:
    """Every case: each report and snapshot in table and JSON, what-if and timeline on the reports with kernel
    timestamps, ranks, the FLOP rate, --nvtx, --phase and representative comparisons."""
    out = []
    for path in kernel_reports():
        stem = "examples_" + _stem(path) if path.startswith("profiles/") else _stem(path)
        stem += "" if path.endswith((".sqlite", ".json.gz")) else "_" + Path(path).suffix[1:]
        for fmt in ("table", "json"):
            out.append(Case(f"summarize_{stem}.{fmt}", ("kernels", "summarize", path, "--format", fmt)))
        if _timed(path):
            out.append(Case(f"whatif_{stem}.json", ("kernels", "whatif", path, "--speedup", "matmul=2",
                                                    "--speedup", "elementwise=1.5", "--format", "json")))
            out.append(Case(f"whatif_{stem}_no_gaps.table", ("kernels", "whatif", path, "--no-launch-gaps")))
    for path in snapshots():
        for fmt in ("table", "json"):
            out.append(Case(f"memory_{_stem(path)}.{fmt}", ("memory", "summarize", path, "--format", fmt)))
    k = f"{KERNELS}/"
    bf16, fp32, trace = k + "h100_tiny_train_bf16.sqlite", k + "h100_tiny_train_fp32.sqlite", \
        k + "h100_tiny_train_bf16_trace.json.gz"
    gloo = (k + "cpu_ddp2_gloo.rank0.json.gz", k + "cpu_ddp2_gloo.rank1.json.gz")
    flops = ("--flops-per-step", "2e12", "--peak-tflops", "989")
    out += [
        Case("summarize_ranks_cpu_ddp2_gloo.table", ("kernels", "summarize", *gloo)),
        Case("summarize_ranks_cpu_ddp2_gloo.json", ("kernels", "summarize", *gloo, "--format", "json")),
        Case("summarize_flops_bf16.wide", ("kernels", "summarize", bf16, *flops, "--wide")),
        Case("summarize_flops_bf16.json", ("kernels", "summarize", bf16, *flops, "--format", "json")),
        Case("summarize_flops_example_mlp.wide", ("kernels", "summarize", k + "h100_example_mlp.sqlite", *flops,
                                                  "--wide")),
        Case("summarize_nvtx_forward_bf16.table", ("kernels", "summarize", bf16, "--nvtx", "forward")),
        Case("summarize_nvtx_forward_trace.json", ("kernels", "summarize", trace, "--nvtx", "forward",
                                                   "--format", "json")),
        Case("summarize_asked_phases_bf16.table", ("kernels", "summarize", bf16, "--phase", "backward",
                                                   "--phase", "forward", "--phase", "absent")),
        Case("summarize_asked_phases_gpu2.wide", ("kernels", "summarize", k + "gpu2_ddp_nccl.sqlite",
                                                  "--phase", "forward", "--wide")),
        Case("summarize_columns_bf16.table", ("kernels", "summarize", bf16, "--columns", "phase,idle_pct,verdict")),
        Case("compare_bf16_fp32.table", ("kernels", "compare", bf16, fp32)),
        Case("compare_bf16_fp32.json", ("kernels", "compare", bf16, fp32, "--format", "json")),
        Case("compare_flash_sdpa.table", ("kernels", "compare", k + "h100_tiny_train_bf16_flash.sqlite",
                                          k + "h100_tiny_train_bf16_sdpa.sqlite", "--wide")),
        Case("compare_runs.table", ("kernels", "compare", bf16, trace, "--against", fp32,
                                    k + "h100_tiny_train_bf16_sdpa.sqlite", "--fail-above", "5")),
        Case("compare_gloo_ranks.table", ("kernels", "compare", *gloo)),
        Case("compare_stats_csv.table", ("kernels", "compare",
                                         k + "nsys2025_h100_tiny_train_bf16_cuda_gpu_kern_sum.csv",
                                         k + "nsys2025_h100_tiny_train_fp32_cuda_gpu_kern_sum.csv")),
        Case("memory_compare_tiny_bf16.table", ("memory", "compare", "tests/fixtures/memory/tiny_ctx128_train.pickle",
                                                "tests/fixtures/memory/tiny_ctx128_train_bf16.pickle")),
    ]
    for name, reports in (("bf16", (bf16,)), ("trace", (trace,)), ("gpu2_ddp_nccl", (k + "gpu2_ddp_nccl.sqlite",)),
                          ("example_mlp_step1", (k + "h100_example_mlp.sqlite", "--steps", "1:1")),
                          ("gloo_ranks", gloo)):
        out.append(Case(f"timeline_{name}.json", ("kernels", "timeline", *reports), trace=True))
    return out


@contextlib.contextmanager
def _fixed_run() -> Iterator[None]:
    """The repository root as the working folder, COLUMNS fixed and the `environment` block fixed."""
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        with mock.patch("profiler_kit.environment.environment", lambda: dict(FIXED_ENVIRONMENT)), \
                mock.patch.dict(os.environ, {"COLUMNS": WIDTH}):
            yield
    finally:
        os.chdir(cwd)


def output(case: Case) -> bytes:
    """The case's output: stdout, then stderr after STDERR_MARK when there is any; for a timeline, the trace."""
    from click.testing import CliRunner

    from profiler_kit.cli import main

    with tempfile.TemporaryDirectory() as folder, _fixed_run():
        args = list(case.args)
        if case.trace:
            args += ["-o", str(Path(folder) / "timeline.json")]
        result = CliRunner().invoke(main, args, catch_exceptions=False)
        if result.exit_code not in (0, 1) or (result.exit_code == 1 and "regression" not in result.stderr):
            raise RuntimeError(f"{case.name}: exit {result.exit_code}: {result.stderr.strip()}")
        if case.trace:
            return (Path(folder) / "timeline.json").read_bytes()
        stderr = result.stderr_bytes.replace(folder.encode(), OUT_DIR.encode())
        return result.stdout_bytes + (STDERR_MARK + stderr if stderr else b"")


def stored(case: Case) -> bytes | None:
    """The stored output of a case (unzipped), None when there is none."""
    if not case.path.exists():
        return None
    data = case.path.read_bytes()
    return gzip.decompress(data) if case.zipped else data


def store(case: Case, data: bytes) -> None:
    """Store a case's output; gzipped without a time stamp, so that one output is one file."""
    case.path.parent.mkdir(parents=True, exist_ok=True)
    case.path.write_bytes(gzip.compress(data, mtime=0) if case.zipped else data)


def difference(case: Case, fresh: bytes, lines: int = 40) -> str:
    """The first `lines` lines of a unified diff of the stored output against a fresh one."""
    old = (stored(case) or b"").decode(errors="replace")
    if case.trace:  # one line per event, not one line for the whole trace
        old, new = old.replace("}, {", "},\n{"), fresh.decode(errors="replace").replace("}, {", "},\n{")
    else:
        new = fresh.decode(errors="replace")
    diff = difflib.unified_diff(old.splitlines(), new.splitlines(), "stored", "fresh", lineterm="", n=1)
    return "\n".join(itertools.islice(diff, lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="store every case's output, replacing the stored ones "
                                                             "and removing those of cases that are gone")
    parser.add_argument("--only", metavar="TEXT", default=None, help="only the cases whose name contains TEXT")
    parser.add_argument("--diff", action="store_true", help="print the start of each difference")
    args = parser.parse_args(argv)
    chosen = [c for c in cases() if args.only is None or args.only in c.name]
    differ = []
    for case in chosen:
        data = output(case)
        if stored(case) == data:
            continue
        if args.write:
            store(case, data)
            print(f"wrote {case.path.relative_to(REPO)}")
        else:
            differ.append(case.name)
            print(f"differs: {case.name}")
            if args.diff:
                print(difference(case, data))
    if args.write and args.only is None:
        kept = {case.path for case in chosen}
        for path in sorted(OUTPUTS.iterdir()):
            if path not in kept:
                path.unlink()
                print(f"removed {path.relative_to(REPO)}")
    if not args.write:
        print(f"{len(chosen) - len(differ)} of {len(chosen)} cases as stored")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
