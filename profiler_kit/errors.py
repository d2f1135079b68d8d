"""The one exception the library raises for problems a user can fix (bad input, missing tool, no GPU).

The CLI turns it into a one-line message on stderr and a non-zero exit; anything else is a bug and keeps
its traceback.
"""


class ProfilerKitError(Exception):
    """A user-facing error: its message is printed as is, without a traceback."""
