"""The newcomer's path on a CPU box, as the README gives it: a fresh clone, `make demo`, then `profiler-kit profile
-- python prog.py` on a program of one's own, with no nsys anywhere (torch.profiler, phases and steps, exit 0),
then with an nsys on PATH but no GPU (torch.profiler again, and the line says why).

Kept cheap for CI: the clone holds the repository's tracked files as they are now (a `git clone` of it, with the
tracked files changed since its last commit copied over), and runs on the test's own Python and packages through
a bare virtual environment (no install), whose prefix is not the one `make test` puts Debian's nsys under."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
PROGRAM = """\
import torch

model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.AdamW(model.parameters())
for step in range(5):
    loss = model(torch.randn(16, 32)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
print("trained", flush=True)
"""

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU box's path (no CUDA device)")


def _run(args: list[str], cwd: Path, path: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {"PATH": path, "HOME": os.environ.get("HOME", "/tmp"), "COLUMNS": "80", "LANG": "C.UTF-8"}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def fresh_clone(tmp_path_factory) -> Path:
    """The repository's tracked files, as they are now, in a folder of their own."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs git and a git checkout")
    clone = tmp_path_factory.mktemp("newcomer") / "profiler-kit"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    changed = subprocess.run(["git", "-C", str(REPO), "diff", "--name-only", "HEAD"], check=True,
                             capture_output=True, text=True).stdout.split()
    for name in changed:
        if (REPO / name).exists():
            shutil.copy2(REPO / name, clone / name)
        else:
            (clone / name).unlink(missing_ok=True)
    return clone


@pytest.fixture(scope="module")
def python_without_nsys(tmp_path_factory) -> Path:
    """A virtual environment's bin folder whose python has this one's packages (a .pth file) but not its prefix,
    so that no nsys installed into this environment is found."""
    env = tmp_path_factory.mktemp("env") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.run([env / "bin" / "python", "-c", where], check=True, capture_output=True,
                               text=True).stdout.strip())
    ours = dict.fromkeys(p for p in (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *sys.path)
                         if p.endswith("site-packages") and Path(p).is_dir())
    (site / "outer.pth").write_text("\n".join(ours) + "\n")
    return env / "bin"


def test_a_fresh_clone_the_demo_and_profile_of_a_program_of_ones_own(fresh_clone, python_without_nsys, tmp_path,
                                                                      fake_nsys):
    if shutil.which("make") is None:
        pytest.skip("needs make")
    python = str(python_without_nsys / "python")
    path = os.pathsep.join([str(python_without_nsys), "/usr/bin", "/bin"])
    found = _run([python, "-c", "from profiler_kit.nsys_tool import search_candidates as s; print(len(s()))"],
                 fresh_clone, path)
    if found.stdout.strip() != "0":
        pytest.skip("this machine has an nsys where profiler-kit looks: a machine without one cannot be arranged")

    demo = _run(["make", "demo", f"PY={python}"], fresh_clone, path)
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert "Kernel time by category" in demo.stdout and "allocations alive at the peak" in demo.stdout

    program = tmp_path / "prog.py"
    program.write_text(PROGRAM)
    profile = [python, "-m", "profiler_kit", "profile", "--", "python", str(program)]
    result = _run(profile, fresh_clone, path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "recorder: torch.profiler: no CUDA device and no nsys here" in result.stderr.splitlines()[0]
    _assert_phases_and_steps(result.stdout)
    assert "trained" in result.stderr  # the program's own output, on stderr

    marker = tmp_path / "nsys-ran"
    nsys = fake_nsys(f"touch {marker}")
    result = _run(profile, fresh_clone, os.pathsep.join([str(nsys.parent), path]))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.splitlines()[0] == (
        f"recorder: torch.profiler: no CUDA device here, and nsys 2025.3.1.90 ({nsys}) would record no CPU "
        "operators; the tables show CPU operator time")
    _assert_phases_and_steps(result.stdout)
    assert not marker.exists()  # nsys was asked its version only


def _assert_phases_and_steps(stdout: str) -> None:
    """The summary of the program: its phases and its five steps, in tables 80 columns wide."""
    lines = stdout.splitlines()
    assert max(map(len, lines)) <= 80
    phase_rows = {line.split("│")[1].strip() for line in lines if line.startswith("│")}
    assert {"forward", "backward", "optimizer_step"} <= phase_rows
    steps = next(i for i, line in enumerate(lines) if line.startswith("Per step"))
    rows = [line.split("│")[1].strip() for line in lines[steps:] if line.startswith("│")][:5]
    assert rows == ["0", "1", "2", "3", "4"]
