"""Kernels, launches, NVTX ranges and memory operations from an Nsight Systems SQLite export.

Tables and columns vary with the nsys version and with what was traced: a CPU-only report has no kernel or
runtime table, old exports lack `textId`, and kernel names live in `demangledName` (what `nsys stats` shows by
default), `shortName` or, in old exports, `name`. Kernels are matched to the runtime/driver call that
launched them by correlation id within one process, as nsys's own reports do, but in numpy.

An export may come from anywhere, so every column read is checked once, in `check_fields`, before any query
reads it: a cell of the wrong SQLite type (text where nsys writes an integer, a BLOB name) is an error naming the
table, the column and the row; times are used only as integers within [0, 2^62), other rows are skipped with a
note.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from profiler_kit.errors import ProfilerKitError
from profiler_kit.kernels.trace import (
    NO_LAUNCH,
    KernelTrace,
    LaunchMatcher,
    auto_names,
    blocks,
    kernel_frame,
    memory_frame,
    range_frame,
)
from profiler_kit.names import (
    AUTO_CATEGORY,
    AUTO_PREFIX,
    KIND_AUTO,
    KIND_PHASE,
    KIND_PROGRAM,
    MARK_DOMAIN,
    PROCESS_CATEGORY,
)

KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"
NVTX_TABLE = "NVTX_EVENTS"
MEMORY_TABLES = {"memcpy": "CUPTI_ACTIVITY_KIND_MEMCPY", "memset": "CUPTI_ACTIVITY_KIND_MEMSET"}
NAME_COLUMNS = ("demangledName", "shortName", "name")
# nsys packs a global thread id as (pid << 24) | tid (plus a hardware id above); clearing the low 24 bits
# leaves the process part, which is what kernels carry as `globalPid`.
PROCESS_MASK = ~0xFFFFFF
# Names of the API calls that launch kernels contain this (SQL LIKE pattern).
LAUNCH_CALLS = "%Launch%"
# ENUM_NSYS_EVENT_TYPE's ids of the NVTX events read, stable across schema versions; read from the enum when
# the export has it.
PUSH_POP_EVENT = 59
START_END_EVENT = 60
DOMAIN_CREATE_EVENT = 75
CATEGORY_EVENT = 33
MARK_EVENT = 34
# The NVTX domain of the ranges `profiler_kit.phase` opens and of the recorder's marks.
PHASE_DOMAIN = MARK_DOMAIN
SOURCE = "nsys-sqlite"
# Columns an export must have for its tables to be read at all.
REQUIRED_COLUMNS = {KERNEL_TABLE: {"start", "end"}, NVTX_TABLE: {"start", "end", "eventType"},
                    RUNTIME_TABLE: {"start", "correlationId"}}
# The SQLite types each column read may hold (besides the times, see `_timed`); what nsys writes, plus NULL
# where its schema allows it. Kernel names are StringIds ids, or the name itself in old exports.
ANY_ID = ("integer", "null")
FIELD_TYPES = {
    KERNEL_TABLE: {"correlationId": ANY_ID, "globalPid": ANY_ID, "streamId": ANY_ID,
                   **{name: ("integer", "text") for name in NAME_COLUMNS}},
    RUNTIME_TABLE: {"correlationId": ANY_ID, "globalTid": ANY_ID, "nameId": ("integer",)},
    NVTX_TABLE: {"eventType": ("integer",), "text": ("text", "null"), "textId": ANY_ID, "globalTid": ANY_ID,
                 "domainId": ANY_ID, "category": ANY_ID},
    "StringIds": {"id": ("integer",), "value": ("text",)},
    MEMORY_TABLES["memcpy"]: {"copyKind": ANY_ID},
}
# Rows fetched from SQLite at a time: only this many Python row tuples are alive at once.
FETCH_ROWS = 65_536
# Timestamps are used only within [0, MAX_TIME_NS): differences and sums of them then stay within int64.
MAX_TIME_NS = 2**62


def quoted(name: str) -> str:
    """An SQL identifier, quoted: table names come from the file and may hold any character."""
    return '"' + name.replace('"', '""') + '"'


def connect(path: Path) -> sqlite3.Connection:
    """Open read-only and immutable, so that reading never creates journal, -wal or -shm files, works in a
    read-only folder and never changes the file's modification time."""
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
        # Sorts and temporary indexes in memory: on disk they cost more than the query itself.
        con.execute("PRAGMA temp_store = MEMORY")
        return con
    except sqlite3.Error as exc:
        raise ProfilerKitError(f"{path}: cannot open as SQLite ({exc})") from None


def load_sqlite(path: Path) -> KernelTrace:
    con = connect(path)
    try:
        return _load(con, path)
    except sqlite3.DatabaseError as exc:
        raise ProfilerKitError(f"{path}: damaged or truncated SQLite file ({exc})") from None
    finally:
        con.close()


def table_columns(con: sqlite3.Connection) -> dict[str, set[str]]:
    """Every table of the export → its column names."""
    tables = [row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    return {t: {row[1] for row in con.execute(f"PRAGMA table_info({quoted(t)})")} for t in tables}


def check_fields(con: sqlite3.Connection, schema: dict[str, set[str]]) -> None:
    """Refuse the export when a column read holds a type nsys never writes there (`FIELD_TYPES`), naming the
    table, the column, the row and the value. One scan per table finds a faulty row; only then are its columns
    told apart."""
    for table, fields in FIELD_TYPES.items():
        checked = {column: allowed for column, allowed in fields.items() if column in schema.get(table, ())}
        wrong = {column: f"typeof({column}) NOT IN ({', '.join(repr(kind) for kind in allowed)})"
                 for column, allowed in checked.items()}
        if not wrong:
            continue
        row = con.execute(f"SELECT rowid, {', '.join(wrong.values())} FROM {table} "
                          f"WHERE {' OR '.join(wrong.values())} LIMIT 1").fetchone()
        if row is None:
            continue
        column = next(column for column, bad in zip(wrong, row[1:], strict=True) if bad)
        kind, text = con.execute(f"SELECT typeof({column}), quote({column}) FROM {table} WHERE rowid = ?",
                                 (row[0],)).fetchone()
        value = "NULL" if kind == "null" else f"{kind} {text[:40]}{'...' * (len(text) > 40)}"
        raise ProfilerKitError(f"{table}.{column} of row {row[0]} holds {value}; an nsys export has "
                               f"{' or '.join(checked[column])} there")


def _load(con: sqlite3.Connection, path: Path) -> KernelTrace:
    schema = table_columns(con)
    if "StringIds" not in schema and KERNEL_TABLE not in schema and NVTX_TABLE not in schema:
        raise ProfilerKitError(
            f"{path}: an SQLite file, but not an Nsight Systems export (no StringIds, "
            f"{KERNEL_TABLE} or {NVTX_TABLE} table)"
        )
    for table, needed in REQUIRED_COLUMNS.items():
        missing = sorted(needed - schema.get(table, needed))
        if missing:
            raise ProfilerKitError(f"{path}: table {table} has no {', '.join(missing)} column")
    check_fields(con, schema)
    check_strings(con, schema, path)
    cuda_traced = KERNEL_TABLE in schema or RUNTIME_TABLE in schema
    notes: list[str] = []
    ranges, ranks, nodes = (_ranges(con, schema, notes) if NVTX_TABLE in schema
                            else (range_frame([], [], [], [], []), {}, {}))
    return KernelTrace(
        source=SOURCE,
        path=path,
        kernels=_kernels(con, schema, notes) if KERNEL_TABLE in schema else kernel_frame([], [], [], []),
        ranges=ranges,
        memory_ops=_memory_ops(con, schema, notes) if cuda_traced else None,
        notes=notes,
        process_ranks=ranks,
        process_nodes=nodes,
    )


def check_strings(con: sqlite3.Connection, schema: dict[str, set[str]], path: Path) -> None:
    """Refuse an export whose kernel, launch or range names are ids into a StringIds table it does not have (a
    damaged or cut-down export): read on, every name would be an id and every kernel `other`."""
    if "StringIds" in schema:
        return
    referring = [(KERNEL_TABLE, f"typeof({quoted(kernel_name_column(schema[KERNEL_TABLE]))}) = 'integer'")
                 ] if KERNEL_TABLE in schema else []
    referring += [(table, f"{column} IS NOT NULL") for table, column in ((RUNTIME_TABLE, "nameId"),
                                                                          (NVTX_TABLE, "textId"))
                  if column in schema.get(table, ())]
    for table, refers in referring:
        if con.execute(f"SELECT 1 FROM {table} WHERE {refers} LIMIT 1").fetchone():
            raise ProfilerKitError(f"{path}: an Nsight Systems export whose {table} names are ids into a StringIds "
                                   "table it does not have; export the report again (nsys export --type sqlite)")


def _time(column: str) -> str:
    """SQL condition: `column` is an integer timestamp within [0, MAX_TIME_NS)."""
    return f"(typeof({column}) = 'integer' AND {column} >= 0 AND {column} < {MAX_TIME_NS})"


def _timed(table: str, alias: str = "") -> str:
    """SQL condition: a row whose start and end are timestamps (`_time`) with end ≥ start (NULLs, text or a
    negative duration make a row unusable: SQLite would subtract text as 0)."""
    a = f"{alias}." if alias else ""
    return f"{_time(a + 'start')} AND {_time(a + 'end')} AND {a}end >= {a}start"


def _skipped(con: sqlite3.Connection, table: str, valid: str, what: str, notes: list[str],
             among: str = "1") -> int:
    """Count the rows of `table` (those matching `among`) that fail `valid`: all of them is an error, some a
    note. Returns how many pass."""
    total, bad = con.execute(
        f"SELECT count(*), coalesce(sum(NOT ({valid})), 0) FROM {table} WHERE {among}").fetchone()
    if bad and bad == total:
        raise ProfilerKitError(f"none of the {total:,} rows of {table} has a usable start and end time "
                               f"(integers from 0 to 2^62, end ≥ start)")
    if bad:
        notes.append(f"skipped {bad:,} of {total:,} {what} without a usable start and end time in {table}")
    return total - bad


def fetch_blocks(con: sqlite3.Connection, query: str, columns: int) -> Iterator[np.ndarray]:
    """The rows of `query` (integers) as int64 arrays of at most FETCH_ROWS rows: only one block of Python row
    tuples is alive at once."""
    cursor = con.execute(query)
    while block := cursor.fetchmany(FETCH_ROWS):
        yield np.array(block, dtype=np.int64).reshape(-1, columns)


def fetch_columns(con: sqlite3.Connection, query: str, rows: int, columns: int) -> list[np.ndarray]:
    """The integer columns of `query`'s result (at most `rows` rows) as int64 arrays, filled block by block."""
    out = [np.empty(rows, dtype=np.int64) for _ in range(columns)]
    at = 0
    for values in fetch_blocks(con, query, columns):
        for column, array in enumerate(out):
            array[at: at + len(values)] = values[:, column]
        at += len(values)
    return [array[:at] for array in out]


def kernel_name_column(columns: set[str]) -> str:
    found = next((c for c in NAME_COLUMNS if c in columns), None)
    if found is None:
        raise ProfilerKitError(f"{KERNEL_TABLE} has none of the name columns {', '.join(NAME_COLUMNS)}")
    return found


def _kernels(con: sqlite3.Connection, schema: dict[str, set[str]], notes: list[str]) -> pd.DataFrame:
    """One row per kernel execution, its name an integer code into one table of distinct names (`_names`).
    The launch join is done in numpy (`LaunchMatcher`, the launch calls read block by block): SQLite would
    first build a temporary index over the whole runtime table, which costs more than reading both tables."""
    columns = schema[KERNEL_TABLE]
    process = "globalPid" if "globalPid" in columns else "0"
    correlation = "correlationId" if "correlationId" in columns else "NULL"
    stream = "coalesce(streamId, 0)" if "streamId" in columns else "0"
    count = _skipped(con, KERNEL_TABLE, _timed(KERNEL_TABLE), "kernels", notes)
    if not count:
        return kernel_frame([], [], [], [])
    cell, names, keys, key_codes = _names(con, kernel_name_column(columns), "StringIds" in schema)
    corr, processes, durations, cells, starts, streams = fetch_columns(
        con, f"SELECT coalesce({correlation}, {NO_LAUNCH}), coalesce({process}, 0), end - start, {cell}, start, "
        f"{stream} FROM {KERNEL_TABLE} WHERE {_timed(KERNEL_TABLE)}", count, 6)
    codes = np.empty(len(cells), dtype=np.int32)
    for block in blocks(len(cells)):
        codes[block] = key_codes[np.searchsorted(keys, cells[block])]
    del cells
    matcher = LaunchMatcher(corr, processes if process != "0" else None)
    del corr, processes
    if RUNTIME_TABLE in schema:
        for block in _launches(con, schema, notes):
            matcher.add(block[:, 0], block[:, 1], block[:, 2] & PROCESS_MASK)
    return kernel_frame(pd.Categorical.from_codes(codes, categories=names), durations, matcher.launch_ns,
                        matcher.process, start_ns=starts, stream=streams)


def _launches(con: sqlite3.Connection, schema: dict[str, set[str]], notes: list[str]) -> Iterator[np.ndarray]:
    """Blocks of (correlation id, start, thread) of the runtime/driver calls that can launch kernels."""
    columns = schema[RUNTIME_TABLE]
    where = " WHERE correlationId IS NOT NULL"
    if "nameId" in columns and "StringIds" in schema:
        # cudaLaunchKernel, cuLaunchKernelEx (Triton), cudaGraphLaunch, cudaLaunchCooperativeKernel, ...
        ids = [str(i) for (i,) in con.execute(f"SELECT id FROM StringIds WHERE value LIKE '{LAUNCH_CALLS}'")]
        where += f" AND nameId IN ({', '.join(ids) or 'NULL'})"
    thread = "coalesce(globalTid, 0)" if "globalTid" in columns else "0"
    _skipped(con, RUNTIME_TABLE, _time("start"), "launch calls", notes, among=where.removeprefix(" WHERE "))
    return fetch_blocks(con, f"SELECT correlationId, start, {thread} FROM {RUNTIME_TABLE}{where} "
                             f"AND {_time('start')}", 3)


def _names(con: sqlite3.Connection, column: str, strings: bool) -> tuple[str, list[str], np.ndarray, np.ndarray]:
    """How kernel names are read: the SQL expression to read per kernel (an integer), the sorted distinct names,
    and the integers that expression yields (sorted) with the code of each one's name. Each distinct cell is
    read and looked up once, so a name of any length is held once whatever the number of its kernels. A cell
    is a StringIds id (`strings`: the export has that table) or, in old exports, the name itself."""
    cells = [cell for (cell,) in con.execute(f"SELECT DISTINCT {column} FROM {KERNEL_TABLE} "
                                             f"WHERE {_timed(KERNEL_TABLE)}")]
    if any(isinstance(cell, str) for cell in cells):
        # Kernels yield the position of their cell among the distinct ones (a function of this connection),
        # never the text itself.
        number_of = {cell: number for number, cell in enumerate(cells)}
        con.create_function("kernel_cell", 1, number_of.__getitem__, deterministic=True)
        cell, rows = f"kernel_cell({column})", list(enumerate(cells))
    else:
        cell, rows = column, [(i, i) for i in cells]
    ids = [v for _, v in rows if not isinstance(v, str)]
    lookup = dict(con.execute(f"SELECT id, value FROM StringIds WHERE id IN ({', '.join(map(str, ids))})")
                  ) if strings and ids else {}
    found = [v if isinstance(v, str) else lookup.get(v, f"<string {v}>") for _, v in rows]
    names = sorted(set(found))
    position = {name: code for code, name in enumerate(names)}
    keys = np.array([key for key, _ in rows], dtype=np.int64)
    order = np.argsort(keys)
    return cell, names, keys[order], np.array([position[name] for name in found], dtype=np.int32)[order]


def _event_type(con: sqlite3.Connection, schema: dict[str, set[str]], name: str, default: int) -> int:
    if "ENUM_NSYS_EVENT_TYPE" in schema:
        row = con.execute("SELECT id FROM ENUM_NSYS_EVENT_TYPE WHERE name = ?", (name,)).fetchone()
        if row:
            return int(row[0])
    return default


def _ranges(con: sqlite3.Connection, schema: dict[str, set[str]],
            notes: list[str]) -> tuple[pd.DataFrame, dict[int, int], dict[int, int]]:
    """NVTX ranges, and the rank and node each process marked itself with. Push/pop ranges are the program's,
    or phases when pushed in the MARK_DOMAIN domain (whose id the domain's create event gives per process);
    start/end ranges of that domain's `auto` category (or, without the domain, named with AUTO_PREFIX) are the
    recorder's automatic marks, a step's number as their int64 payload; other start/end ranges are left out. A
    range never closed (no end) lasts to the end of the report."""
    cols = schema[NVTX_TABLE]
    text = "n.text" if "text" in cols else "NULL"
    if "textId" in cols and "StringIds" in schema:
        name, join = f"coalesce({text}, s.value)", "LEFT JOIN StringIds AS s ON s.id = n.textId"
    else:
        name, join = text, ""
    tid = "coalesce(n.globalTid, 0)" if "globalTid" in cols else "0"
    usable = f"{_time('n.start')} AND (n.end IS NULL OR ({_time('n.end')} AND n.end >= n.start))"
    domain = "n.domainId" if "domainId" in cols else "NULL"
    category = "n.category" if "category" in cols else "NULL"
    payload = "coalesce(" + ", ".join(
        [f"n.{c}" for c in ("int64Value", "uint64Value", "int32Value", "uint32Value") if c in cols] + ["NULL"]) + ")"
    push_pop, start_end = (_event_type(con, schema, "NvtxPushPopRange", PUSH_POP_EVENT),
                           _event_type(con, schema, "NvtxStartEndRange", START_END_EVENT))
    rows = con.execute(
        f"SELECT n.start, n.end, {name}, {tid}, {usable}, {domain}, {category}, {payload}, n.eventType "
        f"FROM {NVTX_TABLE} AS n {join} WHERE n.eventType IN (?, ?) AND {name} IS NOT NULL",
        (push_pop, start_end),
    ).fetchall()
    ours = set(con.execute(
        f"SELECT {domain}, {tid} & {PROCESS_MASK} FROM {NVTX_TABLE} AS n {join} WHERE n.eventType = ? AND {name} = ?",
        (_event_type(con, schema, "NvtxDomainCreate", DOMAIN_CREATE_EVENT), PHASE_DOMAIN),
    ).fetchall())
    categories = {(d, pid, c): n for d, pid, c, n in con.execute(
        f"SELECT {domain}, {tid} & {PROCESS_MASK}, {category}, {name} FROM {NVTX_TABLE} AS n {join} "
        "WHERE n.eventType = ?", (_event_type(con, schema, "NvtxCategory", CATEGORY_EVENT),)) if (d, pid) in ours}
    bad = sum(1 for row in rows if not row[4])
    if bad:
        notes.append(f"skipped {bad:,} of {len(rows):,} NVTX ranges without a usable start and end time")
    kept, kinds, numbers = [], [], []
    for row in rows:
        if not row[4]:
            continue
        process = row[3] & PROCESS_MASK
        if row[8] == push_pop:
            kind = KIND_PHASE if (row[5], process) in ours else KIND_PROGRAM
        elif categories.get((row[5], process, row[6])) == AUTO_CATEGORY or str(row[2]).startswith(AUTO_PREFIX):
            kind = KIND_AUTO
        else:
            continue
        kept.append(row)
        kinds.append(kind)
        numbers.append(row[7] if kind == KIND_AUTO and isinstance(row[7], int) else None)
    unclosed = sum(1 for row in kept if row[1] is None)
    if unclosed:
        notes.append(f"{unclosed:,} of {len(kept):,} NVTX ranges were never closed: each is taken to last to the "
                     "end of the report, so phase times that include them may exceed the total")
    starts = np.array([row[0] for row in kept], dtype=np.int64)
    known_ends = [row[1] for row in kept if row[1] is not None]
    last = max(int(starts.max(initial=0)), max(known_ends, default=0))
    ends = np.array([last if row[1] is None else row[1] for row in kept], dtype=np.int64)
    tids = np.array([row[3] for row in kept], dtype=np.int64)
    names, prefixed, prefixed_numbers = auto_names(pd.Series([row[2] for row in kept], dtype=object))
    numbers = [p if prefix else n for n, p, prefix in zip(numbers, prefixed_numbers, prefixed, strict=True)]
    ranges = range_frame(names, starts, ends, tids & PROCESS_MASK, tids, kinds, numbers)
    ranks, nodes = _places(con, schema, name, join, tid, domain, category, ours, categories)
    return ranges, ranks, nodes


def _places(con: sqlite3.Connection, schema: dict[str, set[str]], name: str, join: str, tid: str, domain: str,
            category: str, ours: set, categories: dict) -> tuple[dict[int, int], dict[int, int]]:
    """Process id → RANK and → node, from the marks each recorded process left (`rank=R world_size=W ...` in
    the MARK_DOMAIN domain's `process` category, or prefixed `profiler_kit::process ` without the domain)."""
    ranks: dict[int, int] = {}
    nodes: dict[int, int] = {}
    marks = con.execute(
        f"SELECT {tid} & {PROCESS_MASK}, {domain}, {category}, {name} FROM {NVTX_TABLE} AS n {join} "
        "WHERE n.eventType = ?", (_event_type(con, schema, "NvtxMark", MARK_EVENT),)).fetchall()
    prefix = f"{AUTO_PREFIX}{PROCESS_CATEGORY} "
    for process, mark_domain, mark_category, text in marks:
        if not isinstance(text, str):
            continue
        if categories.get((mark_domain, process, mark_category)) == PROCESS_CATEGORY:
            fields = text
        elif text.startswith(prefix):
            fields = text[len(prefix):]
        else:
            continue
        said = dict(part.split("=", 1) for part in fields.split() if "=" in part)
        if said.get("rank", "").isdigit():
            ranks[process] = int(said["rank"])
        if said.get("node", "").isdigit():
            nodes[process] = int(said["node"])
    return ranks, nodes


def _memory_ops(con: sqlite3.Connection, schema: dict[str, set[str]], notes: list[str]) -> pd.DataFrame:
    """memcpy totals by copy kind (Host-to-Device, ...) and memset totals; empty when none were traced."""
    rows: list[tuple[str, int]] = []
    for kind, table in MEMORY_TABLES.items():
        if table not in schema:
            continue
        if not {"start", "end"} <= schema[table]:
            raise ProfilerKitError(f"table {table} has no start or end column")
        _skipped(con, table, _timed(table), f"{kind} operations", notes)
        if kind == "memcpy" and "copyKind" in schema[table] and "ENUM_CUDA_MEMCPY_OPER" in schema:
            label = "label" if "label" in schema["ENUM_CUDA_MEMCPY_OPER"] else "name"
            query = (
                f"SELECT 'memcpy ' || coalesce(e.{label}, m.copyKind), m.end - m.start FROM {table} AS m "
                f"LEFT JOIN ENUM_CUDA_MEMCPY_OPER AS e ON e.id = m.copyKind WHERE {_timed(table, 'm')}"
            )
        else:
            query = f"SELECT '{kind}', end - start FROM {table} WHERE {_timed(table)}"
        rows += con.execute(query).fetchall()
    return memory_frame([op for op, _ in rows], [duration for _, duration in rows])
