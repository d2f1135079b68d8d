"""Big inputs grown from real reports, and the time and peak memory of summarizing them against a floor.

Each builder repeats a real recording end to end, each copy shifted in time past the one before it:
- an nsys SQLite export to N kernels (`kernels/speedtest.py`: correlation ids moved past the ones used);
- a torch.profiler trace to N events: every copy's `ts` moved by the trace's span, its correlation, external
  and flow ids moved past the largest id of the source, so kernels, launches, flows, threads and ranges of a
  copy stay linked to each other only; the process and thread metadata (`ph` M) is written once;
- a CUDA memory snapshot to N trace entries: every copy's `time_us` (and the `record_function` annotations)
  moved by the trace's span. The source must be one steady step: what it frees without having allocated it
  (made in the step before) matches by size what it still holds at its end, so in every copy after the first
  those frees are moved to the addresses the copy before left alive, and every alloc has its free. Segment
  events, which a steady step does not repeat, stay in the first copy; the recorder's sidecar, when there is
  one, gets each copy's phases as further steps.

`measure` runs a command in a child process and reads its wall time, CPU time and peak RSS (`getrusage`).
The floors are what any tool must at least do with the same file: one SQL query joining kernels to their
launches grouped by name; one streaming pass over the trace's events (`ijson`, each event built as a dict, as the
summary reads them); `pickle.load` of the snapshot, and PyTorch's own `torch.cuda._memory_viz.trace` (text of
every trace entry) beside it. Each row notes the machine's load average over its runs: on a shared machine wall
times stretch with it, CPU times and peak memory much less.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import pickle
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from profiler_kit.errors import ProfilerKitError
from profiler_kit.kernels.nsys_sqlite import KERNEL_TABLE, kernel_name_column, table_columns
from profiler_kit.kernels.speedtest import build_repeated_export, reference_query
from profiler_kit.memory.analyze import SEGMENT_SIGN, pick_device
from profiler_kit.memory.snapshot import EMBEDDED_KEY, load_sidecar, load_snapshot, sidecar_path

MIB = 1024**2
# Ids that link a copy's events to each other (launch ↔ kernel, operator ↔ its backward): moved by the same
# step in every copy. Thread ids ("Fwd thread id") stay.
TRACE_ID_ARGS = ("External id", "correlation", "Sequence number")
_FREES = ("free_requested", "free_completed")
SCALE_COLUMNS = ["input", "rows", "size_mib", "command", "wall_s", "cpu_s", "peak_rss_mib", "floor", "floor_s",
                 "floor_cpu_s", "floor_rss_mib", "ratio", "cpu_ratio", "torch_tool_s", "torch_tool_cpu_s",
                 "torch_tool_rss_mib", "load_avg", "status"]


@dataclass(frozen=True)
class Measurement:
    """One child process: its wall time, its peak resident memory and how it ended."""

    wall_s: float
    cpu_s: float
    peak_rss_mib: float
    returncode: int
    error: str = ""
    load_avg: float = 0.0  # the machine's 1-minute load average, between its start and its end


# Runs argv[3:] as its child and writes its wall seconds, CPU seconds (user + system: on a shared machine the
# steadier of the two) and peak RSS (KiB) to the file argv[1]; argv[2], when not 0, caps the child's address
# space (bytes; at most the limit this process has), so that a run past a memory bound fails instead of filling
# the machine. A process's peak RSS starts at its parent's size when it is spawned, so the command is spawned
# from this small process, not from the benchmark (which holds pandas and the builders).
_WRAPPER = ("import resource, subprocess, sys, time; cap = int(sys.argv[2]); "
            "hard = resource.getrlimit(resource.RLIMIT_AS)[1]; cap = min(cap, hard) if hard >= 0 else cap; "
            "cap and resource.setrlimit(resource.RLIMIT_AS, (cap, hard)); t = time.perf_counter(); "
            "rc = subprocess.call(sys.argv[3:]); t = time.perf_counter() - t; "
            "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
            "open(sys.argv[1], 'w').write(f'{t} {u.ru_utime + u.ru_stime} {u.ru_maxrss}'); sys.exit(rc)")


def measure(argv: list[str], address_space_mib: int | None = None) -> Measurement:
    """Run `argv` with stdout discarded; its wall and CPU time, the peak RSS of that process alone (counted from a
    small launcher's size, ~10 MiB), its exit status and the last line it wrote on stderr when it failed.
    `address_space_mib` caps its address space (a run past it fails, out of memory)."""
    cap = str((address_space_mib or 0) * MIB)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        usage, err = Path(tmp) / "usage", Path(tmp) / "stderr"
        with open(err, "wb") as fh:
            rc = subprocess.call([sys.executable, "-c", _WRAPPER, str(usage), cap, *argv],
                                 stdout=subprocess.DEVNULL, stderr=fh)
        wall, cpu, rss_kib = usage.read_text().split()
        lines = err.read_text(errors="replace").strip().splitlines()
    return Measurement(float(wall), float(cpu), int(rss_kib) / 1024, rc, lines[-1] if rc and lines else "",
                       (load_before + os.getloadavg()[0]) / 2)


def _python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


def cli(*args: str, max_input_mb: int) -> list[str]:
    """`profiler-kit ARGS` in this interpreter, with the input limit raised for the big file."""
    return [sys.executable, "-m", "profiler_kit", "--max-input-mb", str(max_input_mb), *args]


SQL_FLOOR = "import sqlite3, sys; sqlite3.connect(sys.argv[1]).execute(sys.argv[2]).fetchall()"
STREAM_FLOOR = ("import gzip, ijson, sys; p = sys.argv[1]; f = gzip.open(p, 'rb') if p.endswith('.gz') else "
                "open(p, 'rb'); sum(1 for _ in ijson.items(f, 'traceEvents.item', use_float=True))")
PICKLE_FLOOR = "import pickle, sys; pickle.load(open(sys.argv[1], 'rb'))"
MEMORY_VIZ = ("import pickle, sys; from torch.cuda import _memory_viz as v; "
              "v.trace(pickle.load(open(sys.argv[1], 'rb')))")


# --- torch.profiler traces ------------------------------------------------------------------------------------

def _read_trace(source: Path) -> dict:
    opener = gzip.open if source.suffix == ".gz" else open
    try:
        with opener(source, "rb") as fh:
            obj = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ProfilerKitError(f"{source}: not a readable JSON trace ({exc})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list) or not obj["traceEvents"]:
        raise ProfilerKitError(f"{source}: not a Chrome trace with events (no traceEvents list)")
    return obj


def _trace_extent(events: list[dict]) -> tuple[int, int]:
    """The time shift between copies (the events' span, rounded up to whole µs, plus 1 µs) and the id shift."""
    timed = [e for e in events if e.get("ph") != "M" and isinstance(e.get("ts"), (int, float))]
    first = min(e["ts"] for e in timed)
    last = max(e["ts"] + (e.get("dur") or 0) for e in timed)
    top = 0
    for e in events:
        if isinstance(e.get("id"), int):
            top = max(top, e["id"])
        args = e.get("args")
        if isinstance(args, dict):
            top = max([top, *(args[k] for k in TRACE_ID_ARGS if isinstance(args.get(k), int))])
    return math.ceil(last - first) + 1, top + 1


def _shifted_event(event: dict, dt: int, did: int) -> dict:
    out = dict(event)
    if isinstance(out.get("ts"), (int, float)):
        out["ts"] = out["ts"] + dt
    if isinstance(out.get("id"), int):
        out["id"] = out["id"] + did
    args = out.get("args")
    if isinstance(args, dict) and any(isinstance(args.get(k), int) for k in TRACE_ID_ARGS):
        out["args"] = {k: v + did if k in TRACE_ID_ARGS and isinstance(v, int) else v for k, v in args.items()}
    return out


def build_repeated_trace(source: Path, target: Path, events: int) -> int:
    """Write `target` (plain JSON): the torch.profiler trace `source` repeated until it holds at least `events`
    events. Returns the number of copies."""
    obj = _read_trace(source)
    trace = obj.pop("traceEvents")
    metadata = [e for e in trace if isinstance(e, dict) and e.get("ph") == "M"]
    body = [e for e in trace if isinstance(e, dict) and e.get("ph") != "M"]
    if not body:
        raise ProfilerKitError(f"{source}: only metadata events, nothing to repeat")
    copies = max(1, math.ceil((events - len(metadata)) / len(body)))
    span, id_step = _trace_extent(body)
    with open(target, "w") as out:
        header = json.dumps(obj)
        out.write(header[:-1] + (", " if obj else "") + '"traceEvents": [')
        out.write(json.dumps(metadata)[1:-1])
        for k in range(copies):
            chunk = body if k == 0 else [_shifted_event(e, k * span, k * id_step) for e in body]
            out.write((", " if metadata or k else "") + json.dumps(chunk)[1:-1])
        out.write("]}")
    return copies


# --- memory snapshots -----------------------------------------------------------------------------------------

def _address_moves(entries: list[dict]) -> dict[int, int]:
    """For a steady step: entry index → new address, for the frees (requested and completed) of allocations made
    before the step, each moved to an allocation of the same size that the step still holds at its end (both
    taken in address order per size)."""
    live: dict[int, int] = {}
    before: dict[int, int] = {}
    allocated: set[int] = set()
    early: dict[int, list[int]] = defaultdict(list)  # address → its frees before any alloc there
    for i, entry in enumerate(entries):
        action = entry["action"]
        if action == "alloc":
            live[entry["addr"]] = entry["size"]
            allocated.add(entry["addr"])
        elif action in _FREES and entry["addr"] not in allocated:
            early[entry["addr"]].append(i)
            if action == "free_completed":
                before[entry["addr"]] = entry["size"]
        if action == "free_completed":
            live.pop(entry["addr"], None)
    if Counter(before.values()) != Counter(live.values()):
        raise ProfilerKitError(
            f"the trace is not one steady step: it frees {len(before)} allocations made before it "
            f"({sum(before.values()):,} B) but holds {len(live)} at its end ({sum(live.values()):,} B), so its "
            "copies would not free what the copy before them made")
    by_size: dict[int, list[int]] = defaultdict(list)
    for addr, size in sorted(live.items()):
        by_size[size].append(addr)
    target = {addr: by_size[size].pop(0) for addr, size in sorted(before.items())}
    return {i: target[addr] for addr, indices in early.items() if addr in target for i in indices}


def _check_steady(entries: list[dict], moves: dict[int, int]) -> None:
    """Replay a second copy after the first: every free must find its alloc, every alloc a free address."""
    live: set[int] = set()
    for entry in entries:
        if entry["action"] == "alloc":
            live.add(entry["addr"])
        elif entry["action"] == "free_completed":
            live.discard(entry["addr"])
    for i, entry in enumerate(entries):
        action, addr = entry["action"], moves.get(i, entry.get("addr"))
        if action == "alloc" and addr in live:
            raise ProfilerKitError(f"the trace is not one steady step: a copy would allocate at {addr:#x} while the "
                                   "copy before it still holds it")
        if action == "alloc":
            live.add(addr)
        elif action == "free_completed" and addr not in live:
            raise ProfilerKitError(f"the trace is not one steady step: a copy would free {addr:#x}, which nothing "
                                   "holds")
        elif action == "free_completed":
            live.discard(addr)


def _copy_entries(entries: list[dict], k: int, dt: int, moves: dict[int, int]) -> Iterator[dict]:
    for i, entry in enumerate(entries):
        if k and entry["action"] in SEGMENT_SIGN:
            continue
        out = dict(entry)
        # Each entry gets its own list of frames, as torch writes them; the frames themselves are shared.
        if isinstance(out.get("frames"), list):
            out["frames"] = list(out["frames"])
        if isinstance(out.get("time_us"), int):
            out["time_us"] += dt
        if k and i in moves:
            out["addr"] = moves[i]
        yield out


def _shift_annotations(annotations: Iterable, copies: int, dt: int) -> list:
    return [dict(a, time_us=a["time_us"] + k * dt) if isinstance(a, dict) and isinstance(a.get("time_us"), int)
            else a for k in range(copies) for a in annotations]


def _repeated_sidecar(meta: dict, copies: int, dt: int) -> dict:
    phases = meta.get("phases") or []
    steps = 1 + max((p["step"] for p in phases), default=0)
    repeated = [dict(p, step=p["step"] + k * steps, end_time_us=p["end_time_us"] + k * dt)
                for k in range(copies) for p in phases]
    return {**meta, "phases": repeated, "steps": steps * copies}


def build_repeated_snapshot(source: Path, target: Path, entries: int) -> int:
    """Write `target` (and its sidecar, when `source` has one): the snapshot `source` with its busiest device's
    trace repeated until it holds at least `entries` entries (see the module docstring). Returns the number of
    copies."""
    snapshot = load_snapshot(source)
    device = pick_device(snapshot)
    trace = snapshot["device_traces"][device]
    steady = [e for e in trace if e["action"] not in SEGMENT_SIGN]
    if not steady:
        raise ProfilerKitError(f"{source}: the snapshot has no trace entries to repeat")
    times = [e["time_us"] for e in trace if isinstance(e.get("time_us"), int)]
    if len(times) != len(trace):
        raise ProfilerKitError(f"{source}: trace entries without time_us cannot be placed one copy after another")
    moves = _address_moves(trace)
    _check_steady(trace, moves)
    copies = max(1, 1 + math.ceil((entries - len(trace)) / len(steady)))
    dt = max(times) - min(times) + 1
    repeated = [e for k in range(copies) for e in _copy_entries(trace, k, k * dt, moves)]
    traces = list(snapshot["device_traces"])
    traces[device] = repeated
    out = {**snapshot, "device_traces": traces}
    if isinstance(snapshot.get("external_annotations"), list):
        out["external_annotations"] = _shift_annotations(snapshot["external_annotations"], copies, dt)
    if isinstance(snapshot.get(EMBEDDED_KEY), dict):
        out[EMBEDDED_KEY] = _repeated_sidecar(snapshot[EMBEDDED_KEY], copies, dt)
    with open(target, "wb") as fh:
        pickle.dump(out, fh, protocol=pickle.HIGHEST_PROTOCOL)
    meta, _ = load_sidecar(source)
    if meta is not None:
        sidecar_path(target).write_text(json.dumps(_repeated_sidecar(meta, copies, dt), indent=1))
    return copies


# --- the table ------------------------------------------------------------------------------------------------

def _row(name: str, rows: int, path: Path, command: str, run: Measurement, floor: str, floor_run: Measurement,
         torch_run: Measurement | None = None) -> dict:
    failed = [f"{what}: {m.error or f'exit {m.returncode}'}" for what, m in
              ((command, run), (floor, floor_run), ("torch", torch_run)) if m is not None and m.returncode]
    runs = [m for m in (run, floor_run, torch_run) if m is not None]
    return {
        "input": name, "rows": rows, "size_mib": path.stat().st_size / MIB, "command": command,
        "wall_s": run.wall_s, "cpu_s": run.cpu_s, "peak_rss_mib": run.peak_rss_mib, "floor": floor,
        "floor_s": floor_run.wall_s, "floor_cpu_s": floor_run.cpu_s, "floor_rss_mib": floor_run.peak_rss_mib,
        "ratio": run.wall_s / floor_run.wall_s, "cpu_ratio": run.cpu_s / floor_run.cpu_s,
        "torch_tool_s": None if torch_run is None else torch_run.wall_s,
        "torch_tool_cpu_s": None if torch_run is None else torch_run.cpu_s,
        "torch_tool_rss_mib": None if torch_run is None else torch_run.peak_rss_mib,
        "load_avg": sum(m.load_avg for m in runs) / len(runs),
        "status": "; ".join(failed) or "ok",
    }


def _max_input_mb(path: Path) -> int:
    # gzip'd inputs expand; plain ones are read as they are. Twice the file and 256 MiB is room for both.
    return max(256, 2 * math.ceil(path.stat().st_size / MIB))


def bench_export(source: Path, workdir: Path, kernels: int) -> dict:
    """Grow an nsys export to `kernels` kernels and time `kernels summarize` on it against one SQL query."""
    big = workdir / f"{source.stem}_{kernels}_kernels.sqlite"
    copies = build_repeated_export(source, big, kernels)
    run = measure(cli("kernels", "summarize", str(big), "--format", "json", max_input_mb=_max_input_mb(big)))
    floor = measure(_python(SQL_FLOOR, str(big), reference_query(big)))
    rows = copies * _sqlite_kernels(source)
    return _row(big.name, rows, big, "kernels summarize", run, "SQL: kernels ⋈ launches, by name", floor)


def build_long_name_export(source: Path, target: Path, chars: int) -> None:
    """Write `target`: the nsys export `source` with the name of its first kernel made `chars` characters long
    (its template arguments padded), the way a generated kernel may be named."""
    shutil.copyfile(source, target)
    con = sqlite3.connect(target)
    try:
        column = kernel_name_column(table_columns(con)[KERNEL_TABLE])
        (name_id,) = con.execute(f"SELECT {column} FROM {KERNEL_TABLE} ORDER BY start LIMIT 1").fetchone()
        (name,) = con.execute("SELECT value FROM StringIds WHERE id = ?", (name_id,)).fetchone()
        head, _, tail = name.partition("<")
        long = f"{head}<{'x' * max(chars - len(name) - 1, 0)},{tail}" if tail else name + "x" * (chars - len(name))
        con.execute("UPDATE StringIds SET value = ? WHERE id = ?", (long, name_id))
        con.commit()
    finally:
        con.close()


def _sqlite_kernels(path: Path) -> int:
    con = sqlite3.connect(path)
    try:
        return con.execute(f"SELECT count(*) FROM {KERNEL_TABLE}").fetchone()[0]
    finally:
        con.close()


def bench_trace(source: Path, workdir: Path, events: int) -> dict:
    """Grow a torch.profiler trace to `events` events and time `kernels summarize` on it against one streaming
    pass over its events."""
    big = workdir / f"{source.name.split('.')[0]}_{events}_events.json"
    copies = build_repeated_trace(source, big, events)
    trace = _read_trace(source)["traceEvents"]
    rows = sum(e.get("ph") == "M" for e in trace) + copies * sum(e.get("ph") != "M" for e in trace)
    run = measure(cli("kernels", "summarize", str(big), "--format", "json", max_input_mb=_max_input_mb(big)))
    floor = measure(_python(STREAM_FLOOR, str(big)))
    return _row(big.name, rows, big, "kernels summarize", run, "ijson: every event, streamed", floor)


def bench_snapshot(source: Path, workdir: Path, entries: int, torch_tool: bool = True) -> dict:
    """Grow a memory snapshot to `entries` trace entries and time `memory summarize` on it against
    `pickle.load` and PyTorch's `_memory_viz.trace`."""
    big = workdir / f"{source.stem}_{entries}_entries.pickle"
    copies = build_repeated_snapshot(source, big, entries)
    snapshot = load_snapshot(source)
    trace = snapshot["device_traces"][pick_device(snapshot)]
    rows = len(trace) + (copies - 1) * sum(e["action"] not in SEGMENT_SIGN for e in trace)
    run = measure(cli("memory", "summarize", str(big), "--format", "json", max_input_mb=_max_input_mb(big)))
    floor = measure(_python(PICKLE_FLOOR, str(big)))
    viz = measure(_python(MEMORY_VIZ, str(big))) if torch_tool else None
    return _row(big.name, rows, big, "memory summarize", run, "pickle.load", floor, viz)


def scale_table(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=SCALE_COLUMNS)
