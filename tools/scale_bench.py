"""Time `kernels summarize` and `memory summarize` on inputs grown from real reports, against a floor.

Builds each big input once into WORKDIR (an nsys SQLite export repeated to --kernels, a torch.profiler trace to
--events, a memory snapshot's trace to --entries; see profiler_kit/scale.py for how copies stay consistent),
runs the summary in a child process and prints, per input: its rows and size, the summary's wall time, CPU time
and peak RSS, the floor's (one SQL query joining kernels to their launches by name; one streaming pass over the
trace's events; pickle.load of the snapshot) and the ratio of the two, and the machine's load average over the
row's runs; for snapshots also PyTorch's `_memory_viz.trace` on the same file. Sizes take k/M/G suffixes
(1M = 1,000,000). Run from the repository root with the project's python (on a machine without the installed
package: PYTHONPATH=$PWD); `make bench-scale` runs the table of docs/scale.md.
"""

from __future__ import annotations

import argparse
import re
import shutil
import tempfile
from pathlib import Path

from profiler_kit.errors import ProfilerKitError
from profiler_kit.render import FORMATS, console_err, emit_tables
from profiler_kit.scale import bench_export, bench_snapshot, bench_trace, scale_table

REPO = Path(__file__).resolve().parents[1]
EXPORT = REPO / "tests" / "fixtures" / "kernels" / "h100_tiny_train_bf16.sqlite"
TRACE = REPO / "tests" / "fixtures" / "kernels" / "h100_tiny_train_bf16_trace.json.gz"
SNAPSHOT = REPO / "tests" / "fixtures" / "memory" / "h100_tiny_train_snapshot.pickle"
_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}


def count(text: str) -> int:
    """`1M`, `250k`, `1.5M`, `2000000`: a positive count."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)\s*", text)
    value = round(float(match[1]) * _SUFFIX[match[2].lower()]) if match else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive count (e.g. 1M, 250k, 2000000)")
    return value


def counts(text: str) -> list[int]:
    return [count(part) for part in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=" ".join(__doc__.splitlines()[2:]))
    parser.add_argument("--kernels", type=counts, default=[],
                        help="kernel counts of grown nsys exports, comma-separated (e.g. 1M,10M)")
    parser.add_argument("--events", type=counts, default=[],
                        help="event counts of grown torch.profiler traces, comma-separated (e.g. 5M)")
    parser.add_argument("--entries", type=counts, default=[],
                        help="trace-entry counts of grown memory snapshots, comma-separated (e.g. 1M)")
    parser.add_argument("--export", type=Path, default=EXPORT, help="the nsys .sqlite export to grow "
                        f"(default: {EXPORT.relative_to(REPO)})")
    parser.add_argument("--trace", type=Path, default=TRACE, help="the torch.profiler .json[.gz] trace to grow "
                        f"(default: {TRACE.relative_to(REPO)})")
    parser.add_argument("--snapshot", type=Path, default=SNAPSHOT, help="the memory snapshot .pickle to grow: one "
                        f"steady training step (default: {SNAPSHOT.relative_to(REPO)})")
    parser.add_argument("--no-torch-tool", action="store_true",
                        help="skip PyTorch's _memory_viz.trace on the snapshots")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where the big inputs go; kept there (default: a temporary folder, removed after)")
    parser.add_argument("--format", choices=FORMATS, default="table", help="default: table")
    args = parser.parse_args()
    if not (args.kernels or args.events or args.entries):
        parser.error("nothing to measure: give --kernels, --events and/or --entries")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="scale_bench_"))
    rows = []
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        for n in args.kernels:
            console_err.print(f"export with ≥ {n:,} kernels from {args.export.name}…")
            rows.append(bench_export(args.export, workdir, n))
        for n in args.events:
            console_err.print(f"torch trace with ≥ {n:,} events from {args.trace.name}…")
            rows.append(bench_trace(args.trace, workdir, n))
        for n in args.entries:
            console_err.print(f"snapshot with ≥ {n:,} trace entries from {args.snapshot.name}…")
            rows.append(bench_snapshot(args.snapshot, workdir, n, torch_tool=not args.no_torch_tool))
    except ProfilerKitError as exc:
        parser.exit(1, f"Error: {exc}\n")
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    emit_tables([("scale: summaries of grown inputs against their floor", scale_table(rows))], args.format)


if __name__ == "__main__":
    main()
