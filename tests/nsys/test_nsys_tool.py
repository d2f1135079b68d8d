"""nsys_tool with fake `nsys` executables: search order, versions and report names, SQLite export freshness,
the stale-export refusal, and failure messages. Fakes replay messages recorded from real nsys runs
(tests/fixtures/nsys) where we have them."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from profiler_kit import nsys_tool
from profiler_kit.errors import ProfilerKitError
from profiler_kit.nsys_tool import NsysError, NsysInstall, export_sqlite, find_nsys, parse_version, run_stats

FIXTURES = Path(__file__).parents[1] / "fixtures" / "nsys"
V2022 = (FIXTURES / "version-2022.4.2.txt").read_text()
V2025 = (FIXTURES / "version-2025.3.1.txt").read_text()


def fake_nsys(folder: Path, version_text: str, body: str = "", name: str = "nsys") -> Path:
    """A bash `nsys` that logs its arguments to calls.log beside it, answers --version with `version_text`
    and runs `body` (bash) for anything else. Only bash builtins, so an empty PATH is fine."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(
        "#!/bin/bash\n"
        'echo "$*" >> "$(dirname "$0")/calls.log"\n'
        f"if [ \"$1\" = --version ]; then printf '%s' {version_text!r}; exit 0; fi\n"
        f"{body}\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def calls(nsys: Path) -> list[str]:
    log = nsys.parent / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def version_line(version: str) -> str:
    return f"NVIDIA Nsight Systems version {version}-0000000\n"


# ---------------------------------------------------------------------------------------------- versions


def test_parse_version_of_real_outputs():
    assert parse_version(V2022) == (2022, 4, 2, 1)
    assert parse_version(V2025) == (2025, 3, 1, 90)
    with pytest.raises(ValueError):
        parse_version("nsys: command not found")


@pytest.mark.parametrize(
    ("version", "kern", "nvtx_kern", "api"),
    [
        ((2022, 4, 2, 1), "gpukernsum", "nvtxkernsum", "cudaapisum"),
        ((2022, 5, 1), "gpukernsum", "nvtxkernsum", "cudaapisum"),
        ((2023, 1, 1), "cuda_gpu_kern_sum", "nvtx_kern_sum", "cuda_api_sum"),
        ((2025, 3, 1, 90), "cuda_gpu_kern_sum", "nvtx_kern_sum", "cuda_api_sum"),
    ],
)
def test_report_names_follow_the_version(version, kern, nvtx_kern, api):
    install = NsysInstall(Path("/x/nsys"), version)
    # Either spelling in, this version's spelling out; report arguments survive.
    for asked in ("cuda_gpu_kern_sum", "gpukernsum"):
        assert install.report_name(asked) == kern
    assert install.report_name("gpukernsum:base") == kern + ":base"
    assert install.report_names["nvtx_kern_sum"] == nvtx_kern
    assert install.report_names["cuda_api_sum"] == api
    assert install.report_name("my_custom_report.py") == "my_custom_report.py"


# ---------------------------------------------------------------------------------------------- search


def test_search_order(isolated_nsys_search, tmp_path, monkeypatch):
    root = isolated_nsys_search
    places = {
        "explicit": fake_nsys(tmp_path / "explicit", version_line("2025.3.1.90")),
        "env": fake_nsys(tmp_path / "env", version_line("2025.2.1.1")),
        "path": fake_nsys(tmp_path / "onpath", version_line("2025.1.1.1")),
        "cuda_home": fake_nsys(tmp_path / "cudahome" / "bin", version_line("2024.6.1.1")),
        "cuda_old": fake_nsys(root / "usr/local/cuda-12.4/bin", version_line("2024.1.1.1")),
        "cuda_new": fake_nsys(root / "usr/local/cuda-13.0/bin", version_line("2024.5.1.1")),
        "systems_old": fake_nsys(root / "opt/nvidia/nsight-systems/2023.4.1/bin", version_line("2023.4.1.1")),
        "systems_new": fake_nsys(root / "opt/nvidia/nsight-systems/2024.2.1/bin", version_line("2024.2.1.1")),
        "compute": fake_nsys(root / "opt/nvidia/nsight-compute/2025.1.0/host/target-linux-x64",
                             version_line("2024.4.1.1")),
    }
    monkeypatch.setenv("NSYS", str(places["env"]))
    monkeypatch.setenv("PATH", f"{places['path'].parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cudahome"))

    assert find_nsys(places["explicit"]).version == (2025, 3, 1, 90)
    assert find_nsys(places["explicit"].parent).path == places["explicit"]  # a folder holding nsys works too
    order = ["env", "path", "cuda_home", "cuda_new", "cuda_old", "systems_new", "systems_old", "compute"]
    for where in order:
        found = find_nsys()
        assert found.path == places[where], where
        # Take this one away: the next call must find the next place in the order.
        if where == "env":
            monkeypatch.delenv("NSYS")
        elif where == "path":
            monkeypatch.setenv("PATH", os.environ["PATH"].split(os.pathsep, 1)[1])
        elif where == "cuda_home":
            monkeypatch.delenv("CUDA_HOME")
        else:
            places[where].unlink()
    with pytest.raises(NsysError, match="not found"):
        find_nsys()


def test_the_nsys_make_test_installs_is_found_without_being_named(isolated_nsys_search):
    """tools/install_nsys_debian.sh puts Debian's nsys in <venv>/nsys-debian; the running Python's venv is
    searched last."""
    root = isolated_nsys_search
    installed = fake_nsys(Path(str(root) + sys.prefix) / "nsys-debian/usr/lib/nsight-systems/bin",
                          version_line("2022.4.2.1"))
    found = find_nsys()
    assert found.path == installed.absolute() and found.version_str == "2022.4.2.1"


def test_nothing_found_says_what_was_tried_and_points_to_torch(isolated_nsys_search):
    with pytest.raises(NsysError) as err:
        find_nsys()
    message = str(err.value)
    assert "\n" not in message
    for place in ("--nsys", "$NSYS", "PATH", "$CUDA_HOME", "/usr/local/cuda*/bin/nsys",
                  "/opt/nvidia/nsight-systems/*/bin/nsys", "nsight-compute"):
        assert place in message
    assert "--backend torch" in message


def test_a_wrong_explicit_path_is_an_error_not_a_skip(isolated_nsys_search, tmp_path, monkeypatch):
    fake_nsys(tmp_path / "onpath", version_line("2025.1.1.1"))
    monkeypatch.setenv("PATH", str(tmp_path / "onpath"))
    with pytest.raises(NsysError, match="--nsys .*nope"):
        find_nsys(tmp_path / "nope")
    monkeypatch.setenv("NSYS", str(tmp_path / "nope"))
    with pytest.raises(NsysError, match=r"\$NSYS .*nope"):
        find_nsys()


def test_an_nsys_without_a_version_fails_with_its_output(tmp_path):
    broken = fake_nsys(tmp_path, "nsys: cannot open libQt5Core.so.5\n")
    with pytest.raises(NsysError, match="printed no version.*libQt5Core"):
        find_nsys(broken)


# ---------------------------------------------------------------------------------------------- export

EXPORT_OK = """
if [ "$1" = export ]; then
  while [ $# -gt 1 ]; do [ "$1" = --output ] && out=$2; shift; done
  echo "exported from $1" > "$out"; exit 0
fi
"""


def make_report(folder: Path) -> Path:
    report = folder / "run.nsys-rep"
    report.write_bytes(b"report bytes")
    return report


def test_export_only_when_missing_or_stale(tmp_path):
    nsys = find_nsys(fake_nsys(tmp_path / "bin", V2025, EXPORT_OK))
    report = make_report(tmp_path)
    sqlite = export_sqlite(report, nsys)
    assert sqlite == tmp_path / "run.sqlite"
    assert sqlite.read_text() == f"exported from {report}\n"
    assert len([c for c in calls(nsys.path) if c.startswith("export")]) == 1
    assert "--force-overwrite true" in calls(nsys.path)[-1]

    assert export_sqlite(report, nsys) == sqlite  # fresh: no second export
    assert len([c for c in calls(nsys.path) if c.startswith("export")]) == 1

    sqlite.write_text("stale")
    os.utime(sqlite, ns=(report.stat().st_mtime_ns - 10**9,) * 2)
    export_sqlite(report, nsys)
    assert sqlite.read_text().startswith("exported from")
    assert sqlite.stat().st_mtime_ns >= report.stat().st_mtime_ns
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "run.nsys-rep", "run.sqlite"]  # no partial


def test_export_failure_names_command_stderr_tail_and_libdw_hint(tmp_path):
    progress = FIXTURES / "export-progress-2022.4.2.stderr.txt"
    body = (f'cat() {{ while IFS= read -r line; do echo "$line"; done < "$1"; }}\n'
            f'if [ "$1" = export ]; then cat {progress} >&2; echo >&2\n'
            '  echo "/opt/nvidia/nsight-systems/2025.3.1/host-linux-x64/QdstrmImporter: error while loading '
            'shared libraries: libdw.so.1: cannot open shared object file: No such file or directory" >&2\n'
            "  exit 1; fi")
    nsys = find_nsys(fake_nsys(tmp_path / "bin", V2025, body))
    report = make_report(tmp_path)
    with pytest.raises(NsysError) as err:
        export_sqlite(report, nsys)
    message = str(err.value)
    assert "\n" not in message
    assert f"{nsys.path} export --type sqlite" in message
    assert "exit 1" in message
    assert "libdw.so.1: cannot open shared object file" in message
    assert "install libdw1" in message
    assert "Exporting 112 events" not in message  # progress bars are no help in an error
    assert not (tmp_path / "run.sqlite").exists()
    assert not list(tmp_path.glob(".*partial*"))


def test_export_of_a_missing_report():
    with pytest.raises(ProfilerKitError, match="no such file"):
        export_sqlite(Path("/nonexistent/run.nsys-rep"))


# ---------------------------------------------------------------------------------------------- stats

# Emulates a recent nsys: refuses a .nsys-rep whose SQLite beside it is older unless --force-export=true, and
# (like 2022.4, tests/fixtures) rejects --force-export for .sqlite input.
STATS_STALE_REFUSAL = """
if [ "$1" = stats ]; then
  src="${@: -1}"; force=no; [[ " $* " == *" --force-export=true "* ]] && force=yes
  case "$src" in
    *.nsys-rep) sqlite="${src%.nsys-rep}.sqlite"
      if [ $force = no ] && [ -f "$sqlite" ] && [ "$sqlite" -ot "$src" ]; then
        echo "ERROR: $sqlite is older than $src: re-export it with --force-export=true" >&2; exit 1; fi
      [ $force = yes ] && echo "re-exported" > "$sqlite";;
    *.sqlite) if [ $force = yes ]; then
        echo "ERROR: Cannot force export of SQLite data from .sqlite input file." >&2; exit 1; fi;;
  esac
  echo "Processing [$src] with [$3]..."; echo 'Time (%),Total Time (ns),Instances,Name'; exit 0
fi
"""


def test_stats_never_trips_over_a_stale_export(tmp_path):
    nsys = find_nsys(fake_nsys(tmp_path / "bin", V2025, STATS_STALE_REFUSAL))
    report = make_report(tmp_path)
    sqlite = tmp_path / "run.sqlite"
    sqlite.write_text("old export")
    os.utime(sqlite, ns=(report.stat().st_mtime_ns - 10**9,) * 2)
    # The fake does refuse a plain call, as a recent nsys does...
    refused = nsys_tool.run([str(nsys.path), "stats", "--report", "cuda_gpu_kern_sum", str(report)])
    assert refused.returncode == 1 and "older than" in refused.stderr
    # ...and run_stats gets through it, re-exporting.
    out = run_stats(report, "gpukernsum", nsys)
    assert "with [cuda_gpu_kern_sum]" in out
    assert sqlite.read_text() == "re-exported\n"
    # An .sqlite source is read as it is: no --force-export, which nsys rejects there.
    assert "Total Time (ns)" in run_stats(sqlite, "cuda_gpu_kern_sum", nsys)
    assert "--force-export" not in calls(nsys.path)[-1]


def test_stats_tries_the_other_spelling_when_nsys_does_not_know_a_report(tmp_path):
    # A 2022-numbered build that only knows the new names: the version guess is wrong, the retry saves it.
    body = """
if [ "$1" = stats ]; then
  case "$3" in cuda_*|nvtx_*) echo "Processing with [$3]..."; exit 0;; esac
  echo "ERROR: Report '$3' could not be found." >&2; exit 0
fi
"""
    nsys = find_nsys(fake_nsys(tmp_path / "bin", V2022, body))
    source = tmp_path / "run.sqlite"
    source.write_text("sqlite")
    assert run_stats(source, "cuda_gpu_kern_sum", nsys) == "Processing with [cuda_gpu_kern_sum]...\n"
    asked = [c.split()[2] for c in calls(nsys.path) if c.startswith("stats")]
    assert asked == ["gpukernsum", "cuda_gpu_kern_sum"]
    # A report neither spelling knows fails with nsys's words (as 2022.4 does: exit 0 and an ERROR line).
    with pytest.raises(NsysError, match="could not be found.*hint: .*report names changed"):
        run_stats(source, "not_a_report", nsys)


def test_error_lines_count_as_failures_even_with_exit_0():
    unknown = (FIXTURES / "stats-unknown-report-2022.4.2.stderr.txt").read_text()
    garbage = (FIXTURES / "export-garbage-2022.4.2.stderr.txt").read_text()
    for stderr in (unknown, garbage):
        assert nsys_tool.reported_error(subprocess.CompletedProcess(["nsys"], 0, "", stderr))
    assert not nsys_tool.reported_error(subprocess.CompletedProcess(["nsys"], 0, "SKIPPED: no data", ""))
    assert "newer nsys" in nsys_tool.hint_for(garbage)


def test_a_hung_nsys_is_stopped_with_everything_it_started(tmp_path):
    hung = fake_nsys(tmp_path, version_line("2025.3.1.90"), f"sleep 300 & echo $! > {tmp_path / 'child'}; wait")
    with pytest.raises(NsysError, match="did not finish within 1 s; it was stopped"):
        nsys_tool.run([str(hung), "export", "x.nsys-rep"], timeout=1)
    child = int((tmp_path / "child").read_text())
    deadline = time.monotonic() + 10  # killed at once; reaped by init moments later
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    pytest.fail(f"process {child}, started by the hung nsys, still runs")
