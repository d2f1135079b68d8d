"""Test set-up: Triton kernels run in the interpreter when there is no GPU; `gpu` tests skip without CUDA."""

import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

# pytest-xdist's workers share the machine's cores: each worker, and every program a test starts (it inherits the
# environment), runs one intra-op thread, so that no thread spins waiting for a core another worker holds.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402  (after the thread count above, which torch reads when it loads)

from profiler_kit import nsys_tool
from profiler_kit.nsys_tool import NsysError, NsysInstall, find_nsys

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    # Must be set before any @triton.jit decorator runs, i.e. before profiler_kit.attention is imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")


REPO = Path(__file__).resolve().parents[1]
NSYS_INSTALLER = REPO / "tools" / "install_nsys_debian.sh"
NSYS_PREFIX = REPO / ".venv" / "nsys-debian"
NSYS_IN_PREFIX = Path("usr/lib/nsight-systems/bin/nsys")


@pytest.fixture(scope="session")
def nsys() -> NsysInstall:
    """A real nsys: $PK_TEST_NSYS, else the one profiler-kit finds ($NSYS, PATH, ...), else Debian's 2022.4 in
    .venv/nsys-debian, which tools/install_nsys_debian.sh installs when absent; skips when it cannot."""
    if os.environ.get("PK_TEST_NSYS"):
        return find_nsys(os.environ["PK_TEST_NSYS"])
    try:
        return find_nsys()
    except NsysError:
        pass
    if not (NSYS_PREFIX / NSYS_IN_PREFIX).exists():
        proc = subprocess.run(["bash", str(NSYS_INSTALLER), str(NSYS_PREFIX)], capture_output=True, text=True)
        if proc.returncode != 0:
            why = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit status {proc.returncode}"
            pytest.skip(f"no nsys found, and {NSYS_INSTALLER.relative_to(REPO)} could not install one: {why}")
    return find_nsys(NSYS_PREFIX / NSYS_IN_PREFIX)


@pytest.fixture(scope="session")
def nvtx_shim(nsys, tmp_path_factory) -> tuple[Path, Path]:
    """(shim library, wrapper script): `python WRAPPER LIB PROGRAM ARGS` runs PROGRAM with profiler_kit's NVTX
    ranges and marks going through tests/fixtures/nsys/nvtx_shim.c, which Debian's nsys 2022.4 records (it drops
    the `nvtx` package's). Skips without gcc or the nvtx3 headers of the nsys package."""
    gcc = shutil.which("gcc")
    include = nsys.path.resolve().parent / "nvtx" / "include"  # target-linux-x64/nvtx/include/nvtx3
    if gcc is None or not (include / "nvtx3").is_dir():
        pytest.skip("needs gcc and the nvtx3 headers of the Debian nsys package")
    folder = tmp_path_factory.mktemp("nvtx_shim")
    lib = folder / "libshim.so"
    subprocess.run([gcc, "-shared", "-fPIC", "-I", str(include), "-o", str(lib),
                    str(REPO / "tests" / "fixtures" / "nsys" / "nvtx_shim.c"), "-ldl"], check=True)
    wrapper = folder / "with_shim.py"
    wrapper.write_text(
        "import ctypes, runpy, sys\nfrom profiler_kit import nvtx_ranges\n"
        "shim = ctypes.CDLL(sys.argv[1])\n"
        "shim.pk_start.restype = ctypes.c_ulonglong\n"
        "shim.pk_start.argtypes = [ctypes.c_char_p, ctypes.c_longlong, ctypes.c_int, ctypes.c_char_p]\n"
        "shim.pk_end.argtypes = [ctypes.c_ulonglong]\n"
        "nvtx_ranges._push = lambda name, marked=False: shim.pk_push(name.encode(), int(marked))\n"
        "nvtx_ranges._pop = lambda marked=False: shim.pk_pop(int(marked))\n"
        "nvtx_ranges._start = lambda name, number, category='auto': shim.pk_start(name.encode(), number or 0, "
        "number is not None, category.encode())\n"
        "nvtx_ranges._end = lambda handle: shim.pk_end(handle)\n"
        "nvtx_ranges._mark = lambda message, category: shim.pk_mark(message.encode(), category.encode())\n"
        "sys.argv = sys.argv[2:]\nrunpy.run_path(sys.argv[0], run_name='__main__')\n")
    return lib, wrapper


@pytest.fixture(scope="session")
def compiled_facts():
    """Run Python `code` that compiles kernels for sm_90 in a child process and prints a JSON line last;
    return that JSON. A child, because tests may run under the interpreter, which compiles nothing."""

    def run(code: str) -> dict:
        env = {**os.environ, "TRITON_INTERPRET": "0"}
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout.splitlines()[-1])

    return run


@pytest.fixture
def isolated_nsys_search(tmp_path, monkeypatch) -> Path:
    """No nsys unless a test puts one there: empty PATH, no $NSYS or $CUDA_HOME, the install globs moved under
    the returned (empty) root."""
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("NSYS", raising=False)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    root = tmp_path / "root"
    monkeypatch.setattr(nsys_tool, "SEARCH_GLOBS", tuple(str(root) + g for g in nsys_tool.SEARCH_GLOBS))
    return root


@pytest.fixture
def fake_nsys(tmp_path) -> Callable[[str], Path]:
    """Write an executable `nsys` in tmp_path that reports version 2025.3.1.90 for `--version` and runs the given
    bash command for anything else; return its path."""

    def make(command: str) -> Path:
        script = tmp_path / "nsys"
        script.write_text("#!/bin/bash\n"
                          "if [ \"$1\" = --version ]; then echo 'NVIDIA Nsight Systems version 2025.3.1.90-0'\n"
                          f"else {command}; fi\n")
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
        return script

    return make


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
