"""The GPU tests' nsys: `$PK_TEST_NSYS`, or the one profiler-kit finds; they skip without one."""

from __future__ import annotations

import os

import pytest

from profiler_kit.nsys_tool import NsysError, NsysInstall, find_nsys


@pytest.fixture(scope="module")
def gpu_nsys() -> NsysInstall:
    try:
        return find_nsys(os.environ.get("PK_TEST_NSYS"))
    except NsysError as exc:
        pytest.skip(str(exc))
