"""Loading and validating CUDA memory snapshots (`torch.cuda.memory._snapshot()` pickles) and their sidecars.

A snapshot is a plain dict: `segments` (what the caching allocator holds from cudaMalloc, with the blocks
inside each segment) and `device_traces` (per device, the allocator events recorded since
`_record_memory_history`).
Snapshots may come from any program, so nothing here trusts the file: the unpickler builds only plain
containers and refuses every other global, and the structure is checked before any analysis touches it.
"""

from __future__ import annotations

import io
import math
import pickle
from pathlib import Path
from typing import Any

from profiler_kit.errors import ProfilerKitError
from profiler_kit.files import GZIP_MAGIC, NSYS_REPORT_MAGIC, SQLITE_MAGIC, parse_json, read_bytes

# Trace actions whose entries carry an address and a size the analysis reads.
ADDRESS_ACTIONS = frozenset({
    "alloc", "free_requested", "free_completed",
    "segment_alloc", "segment_free", "segment_map", "segment_unmap",
})
SIDECAR_FORMAT = "profiler-kit memory sidecar"
SIDECAR_VERSION = 1
# The key under which the recorder stores the same metadata inside the snapshot dict it pickles.
EMBEDDED_KEY = "profiler_kit"
# Sizes and addresses are summed as int64 by the analysis.
MAX_INT = 2**63
# Builtin containers are the only globals a snapshot pickle may name (protocols below 4 spell sets this way;
# protocol 2 names their module `__builtin__`, as Python 2 did).
_BUILTIN_MODULES = frozenset({"builtins", "__builtin__"})
_ALLOWED_GLOBALS = frozenset({"dict", "list", "tuple", "set", "frozenset"})
# Pickles of protocol 2 and later (torch writes 4 or later) open with the PROTO opcode.
_PROTO = b"\x80"
EXPECTED = ("expected a CUDA memory snapshot pickle (from torch.cuda.memory._dump_snapshot or profiler-kit "
            "memory)")
# What a file that is not a pickle most often is, told by its first bytes.
_KINDS = ((SQLITE_MAGIC, "an SQLite database (e.g. an nsys export)"), (GZIP_MAGIC, "gzip data"),
          (b"PK\x03\x04", "a zip archive"), (NSYS_REPORT_MAGIC, "an nsys report"))


class _RefusedGlobal(pickle.UnpicklingError):
    pass


class _SnapshotUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, strings and numbers; refuses any class or function before importing it."""

    def find_class(self, module: str, name: str) -> Any:
        if module in _BUILTIN_MODULES and name in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise _RefusedGlobal(
            f"it names {module}.{name}, and a memory snapshot holds only dicts, lists, strings and numbers "
            "(refused without importing it)"
        )


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _not_a_pickle(head: bytes) -> str:
    """What a file that does not open like a pickle is, and what was expected instead."""
    kind = next((name for magic, name in _KINDS if head.startswith(magic)), None)
    if kind is None:
        kind = "JSON" if head.lstrip()[:1] in (b"{", b"[") else "text" if b"\x00" not in head else "binary data"
    return f"it is {kind}, not a pickle; {EXPECTED}"


def _unpickle(data: bytes) -> Any:
    try:
        return _SnapshotUnpickler(io.BytesIO(data)).load()
    except _RefusedGlobal as exc:
        raise ValueError(str(exc)) from None
    except EOFError:
        raise ValueError("the pickle is truncated") from None
    # Malformed bytes can fail inside the unpickler in many ways (bad opcode arguments, wrong stack contents,
    # undecodable strings): a file that does not open like a pickle is named by what it is; one that does is a
    # damaged pickle, and the unpickler's reason is kept.
    except Exception as exc:
        if not data.startswith(_PROTO):
            raise ValueError(_not_a_pickle(data[:64])) from None
        if isinstance(exc, pickle.UnpicklingError) and "truncated" in str(exc):
            raise ValueError("the pickle is truncated") from None
        raise ValueError(f"a damaged pickle ({type(exc).__name__}: {_one_line(exc)}); {EXPECTED}") from None


def load_snapshot(path: str | Path) -> dict:
    """Read and validate a snapshot pickle (within the limits of `files.set_limits`); any problem is a one-line
    `ProfilerKitError`."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise ProfilerKitError(f"no such snapshot file: {path}")
    if path.is_dir():
        raise ProfilerKitError(f"{path} is a directory, not a snapshot pickle")
    data = read_bytes(path)
    if not data:
        raise ProfilerKitError(f"cannot read memory snapshot {path}: the file is empty")
    try:
        obj = _unpickle(data)
        _check_expansion(obj, len(data))
        validate_snapshot(obj)
    except ValueError as exc:
        raise ProfilerKitError(f"cannot read memory snapshot {path}: {exc}") from None
    return obj


def _check_expansion(obj: Any, size: int) -> None:
    """A pickle can list one object many times by reference, so a few KB can stand for millions of blocks
    and trace entries; a recorded snapshot spends bytes on each. More items than bytes is refused before
    anything walks them."""
    if not isinstance(obj, dict):
        return
    segments = obj.get("segments") if isinstance(obj.get("segments"), list) else []
    traces = obj.get("device_traces") if isinstance(obj.get("device_traces"), list) else []
    blocks = [seg.get("blocks") for seg in segments if isinstance(seg, dict)]
    lists = [items for items in [*blocks, *traces] if isinstance(items, list)]
    frames = [item.get("frames") for items in lists for item in items if isinstance(item, dict)]
    count = len(segments) + sum(len(items) for items in [*lists, *frames] if isinstance(items, list))
    if count > size:
        raise ValueError(f"it lists {count:,} segments, blocks, trace entries and frames in {size:,} bytes, by "
                         "repeating shared objects; a recorded snapshot spends bytes on each")


def _require(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict):
        raise ValueError(f"{where} is a {type(obj).__name__}, expected a dict")
    if key not in obj:
        raise ValueError(f"{where} has no {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"{where}[{key!r}] is a {type(value).__name__}")
    _check_number(value, f"{where}[{key!r}]")
    return value


def _check_number(value: Any, where: str) -> None:
    """Integers within [0, 2^63) and floats finite within that range: what the analysis sums as int64."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not (
            0 <= value < MAX_INT and (isinstance(value, int) or math.isfinite(value))):
        raise ValueError(f"{where} is {value}, outside 0 to 2^63 - 1")


def _optional(obj: dict, key: str, kind: type | tuple[type, ...], where: str) -> None:
    """A field the analysis reads when present: absent or None is fine, anything else must be `kind`."""
    if obj.get(key) is not None:
        _require(obj, key, kind, where)
    # Every entry has a stack: the common case (dicts of the right field types) is checked in one pass over the
    # field types; only a stack that fails it is walked again by `conform`, which names the fault.
    frames = obj.get(key) if key == "frames" else None
    if frames and (set(map(type, frames)) - {dict}
                   or {(type(f.get("name")), type(f.get("filename")), type(f.get("line"))) for f in frames}
                   - _FRAME_TYPES):
        for k, frame in enumerate(frames):
            conform(frame, FRAME, f"{where}['frames'][{k}]")


def _usual_entry(entry: Any, stacks: dict[tuple[int, int], list[list]]) -> int | None:
    """The bytes a trace entry of the usual shape adds up (its size, 0 without an address), its stack checked
    as `_optional` does; None for any other entry, whose fields `validate_snapshot` then checks one by one to
    name the fault. It accepts only what those checks accept, in a fraction of their time on millions of
    entries: a stack of the same frames as one found well-formed (a snapshot shares each distinct frame among
    the stacks that hold it, as torch writes it and pickle keeps) is not checked again. `stacks`: those found
    well-formed, by the id of their first frame and their length."""
    if type(entry) is not dict:
        return None
    action, device_free, time_us = entry.get("action"), entry.get("device_free"), entry.get("time_us")
    if type(action) is not str or not (device_free is None or _count(device_free)) or not (
            time_us is None or _count(time_us) or (type(time_us) is float and 0 <= time_us < MAX_INT)):
        return None
    size = 0
    if action in ADDRESS_ACTIONS:
        size = entry.get("size")
        if not (_count(entry.get("addr")) and _count(size)):
            return None
    frames = entry.get("frames")
    if frames:
        if type(frames) is not list:
            return None
        # Stacks of one first frame and length, compared to this one (a list compares its items by identity
        # first, so one of the same frames matches at once).
        known = stacks.setdefault((id(frames[0]), len(frames)), [])
        if not any(frames == stack for stack in known):
            if set(map(type, frames)) - {dict} or {(type(f.get("name")), type(f.get("filename")),
                                                     type(f.get("line"))) for f in frames} - _FRAME_TYPES:
                return None
            known.append(frames)
    elif frames is not None and type(frames) is not list:
        return None
    return size


def _count(value: Any) -> bool:
    """An int (not a bool) within [0, 2^63)."""
    return type(value) is int and 0 <= value < MAX_INT


def validate_snapshot(obj: Any) -> None:
    """Raise ValueError naming the first field that does not look like `torch.cuda.memory._snapshot()`."""
    if not isinstance(obj, dict) or "segments" not in obj or "device_traces" not in obj:
        keys = sorted(map(str, obj))[:5] if isinstance(obj, dict) else None
        kind = f"a dict with keys {keys}" if keys is not None else f"a {type(obj).__name__}"
        raise ValueError(f"not a memory snapshot: the pickle holds {kind}, not 'segments'/'device_traces'")
    segments = _require(obj, "segments", list, "snapshot")
    total = 0  # every size the analysis may add up, exactly
    stacks: dict[tuple[int, int], list[list]] = {}  # stacks found well-formed (`_usual_entry`)
    for i, segment in enumerate(segments):
        where = f"segments[{i}]"
        _require(segment, "address", int, where)
        total += _require(segment, "total_size", int, where)
        _optional(segment, "device", int, where)
        for j, block in enumerate(_require(segment, "blocks", list, where)):
            total += _require(block, "size", int, f"{where}.blocks[{j}]")
            _require(block, "state", str, f"{where}.blocks[{j}]")
            _optional(block, "requested_size", int, f"{where}.blocks[{j}]")
            _optional(block, "frames", list, f"{where}.blocks[{j}]")
    for d, trace in enumerate(_require(obj, "device_traces", list, "snapshot")):
        if not isinstance(trace, list):
            raise ValueError(f"device_traces[{d}] is a {type(trace).__name__}, expected a list")
        for i, entry in enumerate(trace):
            size = _usual_entry(entry, stacks)
            if size is not None:
                total += size
                continue
            where = f"device_traces[{d}][{i}]"
            if _require(entry, "action", str, where) in ADDRESS_ACTIONS:
                _require(entry, "addr", int, where)
                total += _require(entry, "size", int, where)
            _optional(entry, "frames", list, where)
            _optional(entry, "device_free", int, where)
            _optional(entry, "time_us", (int, float), where)
    if total >= MAX_INT:
        raise ValueError(f"its sizes add up to {total:,} bytes, past 2^63: no GPU holds that much, and the "
                         "allocated and reserved bytes summed from them would be wrong")


# The shapes of what the analysis reads (see `conform`): a stack frame, and the recorder's metadata.
FRAME = {"name": str, "filename": str, "line?": int}
_FRAME_TYPES = {(str, str, int), (str, str, type(None))}
_OOM = {"step": int, "phase": str, "summary": str}
METADATA = {
    "config?": {"model": str, "ctx": int, "mode": str, "batch_size": int, "mixed_precision": bool},
    "device_name?": str, "steps?": int, "warmup?": int, "max_entries?": int,
    "peak_allocated_bytes?": int, "peak_reserved_bytes?": int,
    "phases?": [{"step": int, "phase": str, "kind?": str, "start_time_us?": (int, float), "end_time_us": (int, float),
                 "completed?": bool, "peak_allocated_bytes?": int, "peak_reserved_bytes?": int,
                 "allocated_bytes?": int}],
    "rank?": int, "world_size?": int, "local_rank?": int, "node?": int,
    "warmup_oom?": str, "oom?": _OOM, "program_oom?": str, "tensor_roles?": {str: [int]},
    "linear_weight_numels?": [int],
}


def conform(value: Any, shape: Any, where: str) -> None:
    """Raise ValueError naming the first part of `value` that does not have `shape`: a type or tuple of types
    (numbers also checked by `_check_number`), `[shape]` for a list of such items, `{str: shape}` for a dict
    of such values, or a dict of named keys, where `key?` may be absent or None and other keys are
    ignored."""
    if isinstance(shape, list):
        if not isinstance(value, list):
            raise ValueError(f"{where} is a {type(value).__name__}, expected a list")
        for i, item in enumerate(value):
            conform(item, shape[0], f"{where}[{i}]")
    elif isinstance(shape, dict):
        if not isinstance(value, dict):
            raise ValueError(f"{where} is a {type(value).__name__}, expected a dict")
        if str in shape:
            for key, item in value.items():
                conform(key, str, f"a key of {where}")
                conform(item, shape[str], f"{where}[{key!r}]")
            return
        for name, part in shape.items():
            key = name.rstrip("?")
            if value.get(key) is None and name.endswith("?"):
                continue
            if key not in value:
                raise ValueError(f"{where} has no {key!r}")
            conform(value[key], part, f"{where}[{key!r}]")
    else:
        kinds = shape if isinstance(shape, tuple) else (shape,)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            names = " or ".join(kind.__name__ for kind in kinds)
            raise ValueError(f"{where} is a {type(value).__name__}, expected {names}")
        _check_number(value, where)


def sidecar_path(snapshot_path: str | Path) -> Path:
    """`<tag>.json` beside `<tag>.pickle`."""
    return Path(snapshot_path).with_suffix(".json")


def _metadata_problem(data: object) -> str | None:
    """Why `data` is not metadata this tool reads, or None."""
    if not isinstance(data, dict) or data.get("format") != SIDECAR_FORMAT:
        return "is not profiler-kit memory metadata"
    if data.get("version") != SIDECAR_VERSION:
        return f"is version {data.get('version')!r} of profiler-kit memory metadata; this tool reads {SIDECAR_VERSION}"
    try:
        conform(data, METADATA, "the metadata")
    except ValueError as exc:
        return f"has the wrong shape: {exc}"
    return None


def load_sidecar(snapshot_path: str | Path) -> tuple[dict | None, str | None]:
    """The recorder's JSON sidecar beside a snapshot, and a note when a file there is not one. A `.json` with the
    snapshot's name may be anything (e.g. a report written with `--format json > run.json`): empty, unreadable,
    not JSON or not the recorder's metadata, it is ignored and the note says why. (None, None) when there is
    none (a foreign snapshot)."""
    path = sidecar_path(snapshot_path)
    if not path.exists() and not path.is_symlink():
        return None, None
    ignored = f"{path.name} beside the snapshot is ignored"
    try:
        data = read_bytes(path)
        if not data.strip():
            return None, f"{ignored}: it is empty"
        parsed = parse_json(data, path)
    except ProfilerKitError as exc:
        return None, f"{ignored}: {exc}"
    problem = _metadata_problem(parsed)
    return (None, f"{ignored}: it {problem}") if problem else (parsed, None)


def embedded_metadata(snapshot: dict) -> dict | None:
    """The metadata the recorder stores inside its snapshots (the sidecar's content), or None."""
    if EMBEDDED_KEY not in snapshot:
        return None
    problem = _metadata_problem(snapshot[EMBEDDED_KEY])
    if problem:
        raise ProfilerKitError(f"the snapshot's {EMBEDDED_KEY!r} entry {problem}; it was not written by this "
                               "profiler-kit")
    return snapshot[EMBEDDED_KEY]


def load_metadata(snapshot_path: str | Path, snapshot: dict, use_sidecar: bool = True
                  ) -> tuple[dict | None, str | None, str | None]:
    """The recorder's metadata, where it came from (the sidecar when present and used, else the snapshot
    itself), and a note when a file in the sidecar's place was ignored."""
    sidecar, note = load_sidecar(snapshot_path) if use_sidecar else (None, None)
    if sidecar is not None:
        return sidecar, "sidecar", None
    try:
        embedded = embedded_metadata(snapshot)
    except ProfilerKitError as exc:
        raise ProfilerKitError(f"{snapshot_path}: {exc}") from None
    return embedded, None if embedded is None else "snapshot", note
