"""JSON objects of any size read in one pass: the items of their one big array member streamed (`ijson`), the
other members parsed from the ends of the file.

A torch.profiler trace is an object whose `traceEvents` array holds every event (gigabytes for a long run) and
whose other members (the recorder's metadata, the host, the clock base) are small and sit before or after it.
Parsed whole, a 1 GB trace takes about 5 GB of Python objects; streamed, only one event at a time.
"""

from __future__ import annotations

import collections
import contextlib
import gzip
import importlib.util
import io
import json
import os
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from profiler_kit.errors import ProfilerKitError
from profiler_kit.files import check_input, is_gzip

# The bytes kept from each end of the file: where the members around its big array are parsed from.
EDGE_BYTES = 2**20
# The bytes the parser reads at a time.
READ_BYTES = 2**16
# Nesting deeper than this is refused (as Python's json module does, near its recursion limit).
MAX_DEPTH = 1_000
# +1 for each byte that opens an array or object, -1 for each that closes one.
_OPENS = np.zeros(256, dtype=np.int64)
_OPENS[list(b"[{")] = 1
_OPENS[list(b"]}")] = -1


class OutOfRange(ProfilerKitError):
    """A number beyond a float or a 64-bit integer, read without `exact`."""


class NotStrict(ProfilerKitError):
    """Text that is not JSON to the letter: NaN and Infinity (which Python's json module writes) or garbage."""


class _Edges:
    """A binary file read through (`read` only), keeping its first EDGE_BYTES bytes and, from the block that
    was the last one read when `marked` was last set on, what follows (while it is no more than EDGE_BYTES);
    refusing text nested deeper than MAX_DEPTH: the streaming parser holds the path to every value, which a
    hostile nesting makes gigabytes long. Depth counts every bracket, those in strings too (real traces nest a
    few levels)."""

    def __init__(self, raw: io.BufferedIOBase, path: Path) -> None:
        self.raw, self.path = raw, path
        self.head, self.tail, self.kept, self.depth = bytearray(), collections.deque(), 0, 0
        self.reads = self.marked = 0

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        if len(self.head) < EDGE_BYTES:
            self.head += data[: EDGE_BYTES - len(self.head)]
        while self.tail and (self.tail[0][0] < self.marked - 1 or self.kept > EDGE_BYTES):
            self.kept -= len(self.tail.popleft()[1])
        self.tail.append((self.reads, data))
        self.kept += len(data)
        self.reads += 1
        self._nesting(data)
        return data

    def _nesting(self, data: bytes) -> None:
        opens = data.count(b"[") + data.count(b"{")
        if self.depth + opens > MAX_DEPTH:  # only then is the deepest point worked out
            depth = self.depth + np.cumsum(_OPENS[np.frombuffer(data, dtype=np.uint8)])
            if depth.max() > MAX_DEPTH:
                raise ProfilerKitError(f"{self.path}: JSON nested deeper than {MAX_DEPTH:,} levels")
        self.depth += opens - data.count(b"]") - data.count(b"}")

    def after_mark(self) -> bytes | None:
        """The bytes from the last block read at the last mark (or the start) to the end; None when they were
        more than EDGE_BYTES, or no longer all kept."""
        kept = [data for number, data in self.tail if number >= self.marked - 1]
        whole = self.tail and self.tail[0][0] <= max(self.marked - 1, 0)
        total = sum(map(len, kept))
        return b"".join(kept) if whole and total <= EDGE_BYTES else None


class StreamedObject:
    """A JSON object file (plain or gzip) whose array member `key` may be of any size, read in one pass: its
    items one at a time (`items`), then its other members (`members`). Members before the array are parsed
    from the first bytes read, those after it from the bytes after its last item; only where those are not
    enough (megabytes of members) is the file parsed a second time for them. Numbers are floats, unless
    `exact`: then integers of any size and decimals (`Decimal`), about half as fast; a float reading of a number
    out of range raises `OutOfRange`, text that is not strict JSON `NotStrict`. Needs the `ijson` package
    (`streamable`)."""

    def __init__(self, path: str | os.PathLike, key: str, exact: bool = False) -> None:
        self.path, self.key, self.exact = Path(path), key, exact
        self._edges: _Edges | None = None
        self._size = check_input(self.path)

    def _open(self) -> io.BufferedIOBase:
        opener = gzip.open if is_gzip(self.path) else open
        try:
            return opener(self.path, "rb")
        except OSError as exc:
            raise ProfilerKitError(f"{self.path}: cannot read ({exc.strerror or exc})") from None

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """Parser, gzip and file errors as one line naming the file."""
        import ijson

        try:
            yield
        except ijson.JSONError as exc:
            message = exc.args[0] if exc.args else exc
            text = message.decode(errors="replace") if isinstance(message, bytes) else str(message)
            text = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
            error = (OutOfRange if "overflow" in text and not self.exact
                     else NotStrict if text.startswith("lexical error") else ProfilerKitError)
            raise error(f"{self.path}: not valid JSON ({text})") from None
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise ProfilerKitError(f"{self.path}: damaged or truncated gzip file ({exc})") from None
        except OSError as exc:
            raise ProfilerKitError(f"{self.path}: cannot read ({exc.strerror or exc})") from None

    def items(self) -> Iterator[object]:
        """The items of the array `key`, in order (none when there is no such array)."""
        import ijson

        with self._open() as raw, self._reading():
            self._edges = _Edges(raw, self.path)
            edges = self._edges
            for item in ijson.items(edges, f"{self.key}.item", buf_size=READ_BYTES, use_float=not self.exact):
                edges.marked = edges.reads  # this item ends in the last block read
                yield item

    def members(self) -> dict[str, object]:
        """The object's members other than `key`, once `items` was read to its end; an error when the file is
        not an object with an array `key`."""
        head, complete, found = self._head()
        if not found:
            raise ProfilerKitError(f"{self.path}: JSON, but not a Chrome trace (no {self.key} list)")
        if complete:
            return head
        tail = self._tail()
        return {**head, **(tail if tail is not None else self._after_array())}

    def _head(self) -> tuple[dict[str, object], bool, bool]:
        """The members parsed from the first bytes: those before the array and, when the whole file was that
        short, those after it; whether that was the whole object, and whether the array was found."""
        import ijson

        members: dict[str, object] = {}
        # basic_parse, not parse: parse spells out the path of every event, which a hostile nesting makes huge.
        events = ijson.basic_parse(io.BytesIO(bytes(self._edges.head)))
        found = complete = False
        try:
            if next(events, (None, None))[0] != "start_map":
                return members, True, False
            for event, value in events:
                if event == "end_map":
                    complete = True
                    break
                if value == self.key:
                    first = next(events)[0]
                    found = found or first == "start_array"
                    _skip(events, first)
                else:
                    members[value] = _value(events)
        except ijson.JSONError:
            pass  # the first bytes end here
        return members, complete, found

    def _tail(self) -> dict[str, object] | None:
        """The members after the array, from the bytes read after its last item began (those from the block
        that holds its end): the first `]` after which the rest parses as the end of an object without `key`;
        None when those bytes were too many to keep, or hold no such place."""
        last = self._edges.after_mark()
        at = -1 if last is None else last.find(b"]")
        while at >= 0:
            rest = last[at + 1:].lstrip()
            if rest[:1] in (b",", b"}"):
                try:
                    members = json.loads(b"{" + (rest[1:] if rest[:1] == b"," else rest))
                except ValueError:
                    members = None
                if isinstance(members, dict) and self.key not in members:
                    return members
            at = last.find(b"]", at + 1)
        return None

    def _after_array(self) -> dict[str, object]:
        """The members after the array, parsed from a second pass over the file."""
        import ijson

        members: dict[str, object] = {}
        with self._open() as raw, self._reading():
            events = ijson.basic_parse(raw)
            next(events)
            for event, value in events:
                if event != "map_key":
                    continue
                if value == self.key:
                    _skip(events, next(events)[0])
                else:
                    members[value] = _value(events)
        return members


def _skip(events: Iterator[tuple[str, object]], first: str) -> None:
    """Past the end of the value whose first event, `first`, was just read from `events` (basic_parse events)."""
    if first not in ("start_map", "start_array"):
        return
    depth = 1
    for event, _value in events:
        depth += event in ("start_map", "start_array")
        depth -= event in ("end_map", "end_array")
        if depth <= 0:
            return


def _value(events: Iterator[tuple[str, object]]) -> object:
    """The value that starts with the next of `events` (basic_parse events)."""
    import ijson

    builder = ijson.ObjectBuilder()
    depth = 0
    for event, value in events:
        builder.event(event, value)
        depth += event in ("start_map", "start_array")
        depth -= event in ("end_map", "end_array")
        if depth == 0:
            return builder.value
    return builder.value


def streamable() -> bool:
    """Whether big JSON inputs can be streamed: the `ijson` package is installed."""
    return importlib.util.find_spec("ijson") is not None
