"""Time `profiler-kit kernels summarize` on an nsys export repeated to ~1M kernels, against one SQL query.

The big report is SOURCE (an nsys .sqlite export) repeated end to end, each copy shifted past the one before it
with its own correlation ids, so it keeps every kernel ↔ launch ↔ NVTX link. The yardstick is one SQL query that
joins kernels to their launches and groups by name; the summary does that join, then attributes every kernel to
its NVTX phases and categorizes it. The target is at most 2× the query. Run it with the project's python from the
repository root (on a machine without the installed package: PYTHONPATH=$PWD).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from profiler_kit.errors import ProfilerKitError
from profiler_kit.kernels.speedtest import DEFAULT_KERNELS, build_repeated_export, time_summary
from profiler_kit.render import FORMATS, console_err, emit_tables


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="an nsys .sqlite export with kernels")
    parser.add_argument(
        "--kernels",
        type=positive,
        default=DEFAULT_KERNELS,
        help=f"repeat SOURCE until the test report holds at least this many kernels (default: {DEFAULT_KERNELS:,})",
    )
    parser.add_argument("--repeats", type=positive, default=3, help="best of this many runs (default: 3)")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="where to write the big report (default: a temporary folder)"
    )
    parser.add_argument("--format", choices=FORMATS, default="table", help="default: table")
    args = parser.parse_args()
    try:
        # The big report (hundreds of MB) is removed afterwards, also from --workdir.
        with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
            big = Path(tmp) / f"{args.source.stem}_x.sqlite"
            console_err.print(f"building {big} from {args.source} (≥ {args.kernels:,} kernels)…")
            copies = build_repeated_export(args.source, big, args.kernels)
            console_err.print(f"{copies} copies of {args.source.name}; timing (best of {args.repeats})…")
            table = time_summary(big, args.repeats)
    except ProfilerKitError as exc:
        parser.exit(1, f"Error: {exc}\n")
    emit_tables([("kernels summarize vs one SQL query", table)], args.format)


if __name__ == "__main__":
    main()
