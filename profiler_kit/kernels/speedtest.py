"""A big nsys export and the least any tool must do with it (`scale.py` times the summary against it).

The big report is a real nsys export repeated end to end until it holds ~1M kernels: each copy shifted in
time past the one before it, with correlation ids moved past the ones used, so every copy keeps its own
kernel ↔ launch ↔ NVTX links. The yardstick is one SQL query that joins kernels to the calls that launched
them and groups by name — what any per-name summary of launches costs.
"""

from __future__ import annotations

import math
import shutil
import sqlite3
from pathlib import Path

from profiler_kit.errors import ProfilerKitError
from profiler_kit.kernels.nsys_sqlite import (
    KERNEL_TABLE,
    MEMORY_TABLES,
    NVTX_TABLE,
    PROCESS_MASK,
    RUNTIME_TABLE,
    connect,
    kernel_name_column,
    table_columns,
)
from profiler_kit.kernels.sources import sniff

DEFAULT_KERNELS = 1_000_000
TIMED_TABLES = (KERNEL_TABLE, RUNTIME_TABLE, NVTX_TABLE, *MEMORY_TABLES.values())
SHIFTED_COLUMNS = ("start", "end")
RENUMBERED_COLUMNS = ("correlationId",)


def build_repeated_export(source: Path, target: Path, kernels: int = DEFAULT_KERNELS) -> int:
    """Write `target`: `source` repeated end to end until it holds at least `kernels` kernels. Returns how
    many copies of the source it holds."""
    if sniff(source) != "sqlite":
        raise ProfilerKitError(f"{source}: not an SQLite file; the speed test repeats an nsys .sqlite export")
    src = connect(source)
    try:
        schema = table_columns(src)
        count = (
            src.execute(f"SELECT count(*) FROM {KERNEL_TABLE}").fetchone()[0] if KERNEL_TABLE in schema else 0
        )
    except sqlite3.DatabaseError as exc:
        raise ProfilerKitError(f"{source}: damaged or truncated SQLite file ({exc})") from None
    finally:
        src.close()
    if count == 0:
        raise ProfilerKitError(f"{source}: no kernels, nothing to repeat")
    copies = math.ceil(kernels / count)
    target.unlink(missing_ok=True)
    shutil.copyfile(source, target)
    con = sqlite3.connect(target)
    try:
        # A scratch file that is rebuilt on every run needs no journal and no fsync.
        con.execute("PRAGMA journal_mode = OFF")
        con.execute("PRAGMA synchronous = OFF")
        tables = [t for t in TIMED_TABLES if t in schema]
        span, id_step = _extent(con, tables, schema)
        con.execute("CREATE TEMP TABLE copies(i INTEGER PRIMARY KEY)")
        con.executemany("INSERT INTO copies VALUES (?)", ((i,) for i in range(1, copies)))
        for table in tables:
            _append_copies(con, table, _ordered_columns(con, table), span, id_step)
        con.commit()
    finally:
        con.close()
    return copies


def _ordered_columns(con: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in con.execute(f'PRAGMA table_info("{table}")')]


def _extent(con: sqlite3.Connection, tables: list[str], schema: dict[str, set[str]]) -> tuple[int, int]:
    """The time shift between copies (the source's whole time span, plus 1 ns) and the id shift."""
    first, last, top_id = None, 0, 0
    for table in tables:
        lo, hi = con.execute(f"SELECT min(start), max(coalesce(end, start)) FROM {table}").fetchone()
        if lo is not None:
            first = lo if first is None else min(first, lo)
            last = max(last, hi)
        if "correlationId" in schema[table]:
            top_id = max(
                top_id, con.execute(f"SELECT coalesce(max(correlationId), 0) FROM {table}").fetchone()[0]
            )
    return last - (first or 0) + 1, top_id + 1


def _append_copies(con: sqlite3.Connection, table: str, columns: list[str], span: int, id_step: int) -> None:
    def expr(column: str) -> str:
        if column in SHIFTED_COLUMNS:
            return f'b."{column}" + copies.i * {span}'
        if column in RENUMBERED_COLUMNS:
            return f'b."{column}" + copies.i * {id_step}'
        return f'b."{column}"'

    names = ", ".join(f'"{c}"' for c in columns)
    con.execute(f'CREATE TEMP TABLE base AS SELECT * FROM "{table}"')
    con.execute(
        f'INSERT INTO "{table}" ({names}) SELECT {", ".join(map(expr, columns))} '
        f"FROM base AS b CROSS JOIN copies"
    )
    con.execute("DROP TABLE base")


def launch_join(schema: dict[str, set[str]]) -> str:
    """SQL joining kernels `k` to their launching calls `r`: same correlation id, same process."""
    same_process = (
        f" AND k.globalPid = (r.globalTid & {PROCESS_MASK})"
        if "globalPid" in schema[KERNEL_TABLE] and "globalTid" in schema[RUNTIME_TABLE]
        else ""
    )
    return f"JOIN {RUNTIME_TABLE} AS r ON r.correlationId = k.correlationId{same_process}"


def reference_query(path: Path) -> str:
    """The yardstick: kernels joined to their launches, grouped by name."""
    con = connect(path)
    try:
        schema = table_columns(con)
    finally:
        con.close()
    if KERNEL_TABLE not in schema or RUNTIME_TABLE not in schema:
        raise ProfilerKitError(f"{path}: needs both {KERNEL_TABLE} and {RUNTIME_TABLE}")
    name = kernel_name_column(schema[KERNEL_TABLE])
    return (
        f"SELECT s.value, count(*), sum(k.end - k.start), min(r.start) FROM {KERNEL_TABLE} AS k "
        f"{launch_join(schema)} JOIN StringIds AS s ON s.id = k.{name} GROUP BY k.{name}"
    )
