"""Cross-config peak table for docs/results/memory-h100.md, from the JSON sidecars that `profiler-kit memory` wrote
(copied from the GPU machine into results/memory/)."""
import json, pathlib
GB = 1e9
print("| ctx | mode | fp32 peak alloc (GB) | bf16 peak alloc (GB) | fp32 reserved (GB) | bf16 reserved (GB) | fp32 per phase fwd / bwd / opt (GB) | bf16 per phase fwd / bwd / opt (GB) |")
print("|---:|---|---:|---:|---:|---:|---|---|")
for mode in ("forward", "train"):
    for ctx in (128, 256, 512):
        s = {p: json.loads(pathlib.Path(f"results/memory/xl_ctx{ctx}_{mode}{p}.json").read_text()) for p in ("", "_bf16")}
        ph = lambda d: " / ".join(f"{x['peak_allocated_bytes'] / GB:.1f}" for x in d["phases"])
        print(f"| {ctx} | {mode} | {s['']['peak_allocated_bytes'] / GB:.1f} | {s['_bf16']['peak_allocated_bytes'] / GB:.1f} "
              f"| {s['']['peak_reserved_bytes'] / GB:.1f} | {s['_bf16']['peak_reserved_bytes'] / GB:.1f} | {ph(s[''])} | {ph(s['_bf16'])} |")
