"""Issue 6, step 21: the eager grid's ratios (SDPA FA2's ms over ours) from `attention bench` result files.

One table per file: rows d, columns N, cells FA2's fwd+bwd median over flash-triton's, then how many shapes are
below 1 for the forward, the backward and fwd+bwd.

Usage: python3 scripts/step21/ratio_grid.py RESULT.jsonl [RESULT.jsonl ...]
"""

from __future__ import annotations

import sys

import pandas as pd

from profiler_kit.attention.bench import COLUMNS, TIMINGS
from profiler_kit.attention.bench_tables import pivot_tables
from profiler_kit.results_io import read_rows


def ratios(path: str) -> pd.DataFrame:
    """`pivot_tables`' flash-triton_vs_sdpa-flash speedups of one file's (one group's) rows: (d, seq) × timing."""
    tables = dict(pivot_tables(pd.DataFrame(read_rows(path), columns=list(COLUMNS))))
    columns = {}
    for timing in TIMINGS:
        speedups = next(table for title, table in tables.items() if title.startswith(f"{timing} speedup"))
        columns[timing] = speedups.set_index(["d", "seq"])["flash-triton_vs_sdpa-flash"]
    return pd.DataFrame(columns).sort_index()


def main(paths: list[str]) -> int:
    for path in paths:
        table = ratios(path)
        print(f"{path}: fwd+bwd, SDPA FA2 ms / ours")
        print(table["fwd_bwd"].unstack("seq").round(2).to_string())
        losses = {timing: int((table[timing] < 1).sum()) for timing in table}
        print(f"slower than FA2 in {losses['fwd_bwd']} of {len(table)} (fwd {losses['fwd']}, bwd {losses['bwd']})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
