"""Running the real command the way a careless or hostile user would: in a child process, under a 4 GiB
address space and 60 s, optionally with a file-size limit that stands in for a full disk."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
ADDRESS_SPACE = 4 * 2**30
TIMEOUT_S = 60


def run_cli(*args: object, file_size: int | None = None, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    """`python -m profiler_kit ARGS` under the limits; `file_size` caps every file it writes (bytes), so a
    write past it fails with EFBIG as on a full disk (Python ignores SIGXFSZ)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
        if file_size is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))

    return subprocess.run([sys.executable, "-m", "profiler_kit", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, preexec_fn=limit, timeout=timeout)


def one_line_failure(proc: subprocess.CompletedProcess) -> str:
    """The single stderr line of a failed run without a traceback."""
    assert proc.returncode not in (0, None), proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), proc.stderr
    return lines[0]


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def failure():
    return one_line_failure
