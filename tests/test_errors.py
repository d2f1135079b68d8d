"""`first_line`: an exception in one line, whatever its message holds."""

import pytest
import torch

from profiler_kit.errors import ProfilerKitError, first_line


@pytest.mark.parametrize(
    "exc, line",
    [
        (ValueError("bad value\nsecond line\nthird"), "ValueError: bad value"),
        (RuntimeError("\n  leading blank lines\nrest"), "RuntimeError: leading blank lines"),
        (KeyError("missing"), "KeyError: 'missing'"),
        (MemoryError(), "MemoryError"),
        (ProfilerKitError("   "), "ProfilerKitError"),
    ],
)
def test_first_line(exc, line):
    assert first_line(exc) == line


def test_first_line_of_a_real_torch_error():
    with pytest.raises(RuntimeError) as info:
        torch.ones(2, 3) @ torch.ones(2, 3)
    line = first_line(info.value)
    assert line.startswith("RuntimeError: ") and "\n" not in line and "2x3" in line
