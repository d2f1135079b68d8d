"""The one exception the library raises for problems a user can fix (bad input, missing tool, no GPU).

The CLI turns it into a one-line message on stderr and exit 1 (2 for a `UsageProblem`); anything else is a bug,
reported in one line with exit 3 (and its traceback under `profiler-kit --debug`).
"""

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class ProfilerKitError(Exception):
    """A user-facing error: its message is printed as is, without a traceback."""


class UsageProblem(ProfilerKitError):
    """A command refused before any work for how it was asked for (an output that exists without --force, or
    that is one of its inputs): exit 2, as a usage error."""


def first_line(exc: BaseException) -> str:
    """An exception in one line, for a result row or a note: `Type: first line of its message` (`Type` alone when
    the message is empty)."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def literal(text: object) -> str:
    """`text` with control characters written as escapes (`\\x1b`, `\\n`), so that names and paths from data
    can neither move the terminal's cursor nor break a line or a row."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], str(text))
