"""Tables derived from attention benchmark rows: pivots (seq × d × impl) of each timing, speedups against the
reference implementations, and the leaderboard.

A speedup column `<impl>_vs_<ref>` is `ref_ms / impl_ms`: above 1 the implementation is faster than the
reference. Each pair appears once: references are taken in `REFERENCE_IMPLS` order and a reference is not
compared again with the references before it.
"""

from __future__ import annotations

import pandas as pd

from profiler_kit.attention.bench import IMPLS, KEY_COLUMNS, REFERENCE_IMPLS, TIMINGS

GROUP_COLUMNS = ("dtype", "causal", "batch", "heads")
LEADERBOARD_REFERENCES = ("sdpa-cudnn", "sdpa-flash")
LEADERBOARD_TIMINGS = ("fwd", "fwd_bwd")
LEADERBOARD_COLUMNS = ("impl", "status", "fwd_ms", "bwd_ms", "fwd_bwd_ms", "fwd_bwd_p20_ms", "fwd_bwd_p80_ms",
                       "fwd_tflops", "fwd_bwd_tflops", "message")


def latest(results: pd.DataFrame) -> pd.DataFrame:
    """One row per config key, the last one written (a resumed result file may hold a key twice)."""
    return results.drop_duplicates(subset=list(KEY_COLUMNS), keep="last").reset_index(drop=True)


def _ordered_impls(present: pd.Index | list) -> list[str]:
    return [impl for impl in IMPLS if impl in set(present)]


def ratio_pairs(impls: list[str]) -> list[tuple[str, str]]:
    """(impl, reference) pairs for the speedup columns among `impls`, each pair once."""
    pairs = []
    earlier: list[str] = []
    for ref in REFERENCE_IMPLS:
        if ref not in impls:
            continue
        earlier.append(ref)
        pairs += [(impl, ref) for impl in impls if impl not in earlier]
    return pairs


def _group_title(dtype: str, causal: bool, batch: int, heads) -> str:
    heads_text = "no heads" if heads is None or pd.isna(heads) else f"H={int(heads)}"
    return f"{dtype}, {'causal' if causal else 'non-causal'}, B={int(batch)}, {heads_text}"


def pivot_tables(results: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """For each (dtype, causal, batch, heads) and each timing: a seq × d table of ms per implementation, then
    (when a reference implementation is in the run) its speedup columns."""
    tables: list[tuple[str, pd.DataFrame]] = []
    results = latest(results)
    for group_key, group in results.groupby(list(GROUP_COLUMNS), sort=False, dropna=False):
        impls = _ordered_impls(group["impl"].unique())
        where = _group_title(*group_key)
        for timing in TIMINGS:
            wide = group.pivot(index=["seq", "d"], columns="impl", values=f"{timing}_ms")
            wide = wide.reindex(columns=impls).sort_index().reset_index()
            wide.columns.name = None
            tables.append((f"{timing}_ms ({where})", wide))
            pairs = ratio_pairs(impls)
            if pairs:
                speedups = wide[["seq", "d"]].copy()
                for impl, ref in pairs:
                    speedups[f"{impl}_vs_{ref}"] = wide[ref] / wide[impl]
                tables.append((f"{timing} speedup, ref_ms / impl_ms ({where})", speedups))
    return tables


def leaderboard_table(results: pd.DataFrame) -> pd.DataFrame:
    """Implementations fastest first by forward+backward time, with fwd and fwd+bwd speedups against the
    SDPA references of the run (`fwd_bwd_vs_sdpa-cudnn` > 1: faster than cuDNN)."""
    board = latest(results).sort_values("fwd_bwd_ms", na_position="last", kind="stable")
    board = board.reset_index(drop=True)
    table = board[list(LEADERBOARD_COLUMNS)].copy()
    for ref in LEADERBOARD_REFERENCES:
        ref_rows = board[board["impl"] == ref]
        if ref_rows.empty:
            continue
        for timing in LEADERBOARD_TIMINGS:
            table.insert(len(table.columns) - 1, f"{timing}_vs_{ref}",
                         ref_rows[f"{timing}_ms"].iloc[0] / board[f"{timing}_ms"])
    return table
