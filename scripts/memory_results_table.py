"""Cross-config peak table for docs/results/memory-h100.md, from the JSON sidecars that `profiler-kit memory`
wrote on the GPU machine (committed in docs/results/data/memory/). Run from the repository root."""

import json
import pathlib

GB = 1e9
HEADER = [
    "ctx", "mode", "fp32 peak alloc (GB)", "bf16 peak alloc (GB)", "fp32 reserved (GB)", "bf16 reserved (GB)",
    "fp32 per phase fwd / bwd / opt (GB)", "bf16 per phase fwd / bwd / opt (GB)",
]  # fmt: skip


def gb(value: int) -> str:
    return f"{value / GB:.1f}"


def phases(sidecar: dict) -> str:
    return " / ".join(gb(p["peak_allocated_bytes"]) for p in sidecar["phases"])


print("| " + " | ".join(HEADER) + " |")
print("|---:|---|---:|---:|---:|---:|---|---|")
for mode in ("forward", "train"):
    for ctx in (128, 256, 512):
        fp32, bf16 = (
            json.loads(pathlib.Path(f"docs/results/data/memory/xl_ctx{ctx}_{mode}{suffix}.json").read_text())
            for suffix in ("", "_bf16")
        )
        cells = [
            str(ctx), mode, gb(fp32["peak_allocated_bytes"]), gb(bf16["peak_allocated_bytes"]),
            gb(fp32["peak_reserved_bytes"]), gb(bf16["peak_reserved_bytes"]), phases(fp32), phases(bf16),
        ]  # fmt: skip
        print("| " + " | ".join(cells) + " |")
