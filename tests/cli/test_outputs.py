"""Outputs: an existing one is replaced only with -f/--force, one that is an input (symlinks followed), its
sidecar or another output of the run is refused before any work (exit 2); a program named without `--`; a
recording's output given with or without the extension its recorder adds."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from profiler_kit.cli import main
from profiler_kit.errors import UsageProblem
from profiler_kit.files import check_output_paths
from profiler_kit.recording.runner import recording_stem

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
BF16 = FIXTURES / "kernels" / "h100_tiny_train_bf16.sqlite"
SNAPSHOT = FIXTURES / "memory" / "tiny_ctx128_train_bf16.pickle"


def cli(*args):
    return CliRunner().invoke(main, [*map(str, args)])


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    """A snapshot and its sidecar copied where the test may write."""
    copy = tmp_path / SNAPSHOT.name
    shutil.copy(SNAPSHOT, copy)
    shutil.copy(SNAPSHOT.with_suffix(".json"), copy.with_suffix(".json"))
    return copy


def test_timeline_replaces_an_existing_trace_only_with_force(tmp_path):
    out = tmp_path / "t.json"
    out.write_text("earlier")
    refused = cli("kernels", "timeline", BF16, "-o", out)
    assert refused.exit_code == 2 and "-f/--force" in refused.stderr and out.read_text() == "earlier"
    forced = cli("kernels", "timeline", BF16, "-o", out, "--force")
    assert forced.exit_code == 0 and "traceEvents" in out.read_text()


@pytest.mark.parametrize("target", ["input", "sidecar", "symlink to input"])
def test_memory_outputs_never_replace_the_snapshot_or_its_sidecar(snapshot, target):
    before = {p: p.read_bytes() for p in (snapshot, snapshot.with_suffix(".json"))}
    path = {"input": snapshot, "sidecar": snapshot.with_suffix(".json")}.get(target)
    if path is None:
        path = snapshot.parent / "link.html"
        path.symlink_to(snapshot)
    for flag in ("--html", "--plot"):
        result = cli("memory", "summarize", snapshot, flag, path, "--force")
        assert result.exit_code == 2 and "is an input" in result.stderr, result.output
        assert result.stdout == ""  # refused before any work
    assert {p: p.read_bytes() for p in before} == before


def test_two_outputs_of_one_run_cannot_be_one_file(snapshot):
    out = snapshot.parent / "report.out"
    result = cli("memory", "summarize", snapshot, "--html", out, "--plot", out)
    assert result.exit_code == 2 and "same file" in result.stderr


def test_memory_summarize_refuses_an_existing_html_without_force(snapshot):
    html = snapshot.parent / "r.html"
    html.write_text("earlier")
    assert cli("memory", "summarize", snapshot, "--html", html).exit_code == 2
    assert html.read_text() == "earlier"
    assert cli("memory", "summarize", snapshot, "--html", html, "-f").exit_code == 0
    assert "<html" in html.read_text().lower()


def test_check_output_paths_follows_hard_links(tmp_path):
    source = tmp_path / "a.sqlite"
    source.write_text("x")
    (tmp_path / "b.json").hardlink_to(source)
    with pytest.raises(UsageProblem):
        check_output_paths([tmp_path / "b.json"], [source], force=True)
    check_output_paths([tmp_path / "new.json"], [source], force=False)


@pytest.mark.parametrize("group", ["nsys", "memory"])
def test_a_program_without_double_dash_gets_a_hint(group):
    result = cli(group, "--backend" if group == "nsys" else "--top", "torch" if group == "nsys" else "3",
                 "python", "x.py")
    assert result.exit_code == 2
    assert "put the program after `--`" in result.stderr and "-- python x.py" in result.stderr


@pytest.mark.parametrize(("backend", "given", "stem"), [
    ("torch", "out/p1.json.gz", "out/p1"),
    ("torch", "out/p1", "out/p1"),
    ("torch", "out/p1.json", "out/p1.json"),
    ("nsys", "out/p1.nsys-rep", "out/p1"),
    ("nsys", "out/p1.sqlite", "out/p1"),
    ("nsys", "out/p1.json.gz", "out/p1.json.gz"),
    ("memory", "out/p1.pickle", "out/p1"),
    ("memory", "out/.pickle", "out/.pickle"),
])
def test_an_output_given_with_the_recorders_extension_means_the_same_recording(backend, given, stem):
    assert recording_stem(Path(given), backend) == Path(stem)


def test_the_torch_backend_writes_the_output_given_with_its_extension(tmp_path):
    program = tmp_path / "prog.py"
    program.write_text("import torch\ntorch.ones(4, 4) @ torch.ones(4, 4)\n")
    result = cli("nsys", "--backend", "torch", "-o", tmp_path / "p1.json.gz", "--format", "json", "--",
                 sys.executable, program)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p1.json.gz", "prog.py"]
