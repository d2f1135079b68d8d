"""What a recorder inside a program could not record, and the guard that keeps its failures from the program.

Every hook the recorder installs (module, optimizer and backward hooks, the mirrors of the program's ranges, the
step clock, the storage captures) runs its own part under `Notes.guard`: an exception there is caught, the
instrument is switched off for the rest of the run, and one note says what was lost and why; the program runs
on with its own output and exit status. The notes travel to the parent in the window file (`channel`) and into
the recording's metadata, and the summary shows them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from profiler_kit.errors import first_line

F = TypeVar("F", bound=Callable[..., Any])
# The instrument that opens, closes and writes the recording (the recorder's own calls).
RECORDING_WINDOW = "the recording window (start, stop, export)"


class Notes:
    """The notes of one recorded process, one per failed instrument."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.failed: set[str] = set()

    def lost(self, what: str, exc: BaseException) -> None:
        """`what` (an instrument, e.g. `the automatic marks`) stops here, failing with `exc`."""
        if what in self.failed:
            return
        self.failed.add(what)
        self.lines.append(f"{what}: not recorded from here on, the recorder's hook failed ({first_line(exc)})")

    def add(self, line: str) -> None:
        if line not in self.lines:
            self.lines.append(line)

    def working(self, what: str) -> bool:
        return what not in self.failed

    def guard(self, what: str, fn: F) -> F:
        """`fn`, returning None instead of raising, and doing nothing once `what` has failed."""

        @functools.wraps(fn)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            if what in self.failed:
                return None
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # the program must run on whatever the recorder does
                self.lost(what, exc)
                return None

        return guarded  # type: ignore[return-value]
