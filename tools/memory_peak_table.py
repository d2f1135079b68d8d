"""Print a Markdown table of fp32 vs bf16 memory peaks per context and mode from `profiler-kit memory` sidecars.

`profiler-kit memory --model M --ctx C --mode MODE [--mixed-precision]` writes a JSON sidecar,
M_ctxC_MODE[_bf16].json, beside each snapshot; this reads the sidecars of every (ctx, mode) pair, both
precisions, and prints one row per pair: peak allocated and reserved bytes, and the peak of each phase, in GB
(10⁹ bytes). docs/memory.md gives the commands that record the sidecars.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

GB = 1e9
HEADER = [
    "ctx", "mode", "fp32 peak alloc (GB)", "bf16 peak alloc (GB)", "fp32 reserved (GB)", "bf16 reserved (GB)",
    "fp32 per phase fwd / bwd / opt (GB)", "bf16 per phase fwd / bwd / opt (GB)",
]  # fmt: skip
ALIGN = ["---:", "---", "---:", "---:", "---:", "---:", "---", "---"]


def gb(value: int) -> str:
    return f"{value / GB:.1f}"


def phase_peaks(sidecar: dict) -> str:
    return " / ".join(gb(p["peak_allocated_bytes"]) for p in sidecar["phases"])


def table(folder: Path, model: str, ctxs: list[int], modes: list[str]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "|".join(ALIGN) + "|"]
    for mode in modes:
        for ctx in ctxs:
            fp32, bf16 = (
                json.loads((folder / f"{model}_ctx{ctx}_{mode}{suffix}.json").read_text()) for suffix in ("", "_bf16")
            )
            cells = [
                str(ctx), mode, gb(fp32["peak_allocated_bytes"]), gb(bf16["peak_allocated_bytes"]),
                gb(fp32["peak_reserved_bytes"]), gb(bf16["peak_reserved_bytes"]), phase_peaks(fp32), phase_peaks(bf16),
            ]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "folder",
        nargs="?",
        type=Path,
        default=Path("memory_snapshots"),
        help="where the sidecars are (default: memory_snapshots, where `make memory` writes them)",
    )
    parser.add_argument("--model", default="xl", help="model preset of the sidecars (default: xl)")
    parser.add_argument("--ctx", default="128,256,512", help="comma list of contexts (default: 128,256,512)")
    parser.add_argument("--mode", default="forward,train", help="comma list of modes (default: forward,train)")
    args = parser.parse_args()
    try:
        print(table(args.folder, args.model, [int(c) for c in args.ctx.split(",")], args.mode.split(",")))
    except (OSError, ValueError, KeyError) as exc:
        parser.exit(1, f"memory_peak_table: {exc}\n")


if __name__ == "__main__":
    main()
