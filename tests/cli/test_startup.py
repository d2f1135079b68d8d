"""The command line starts without torch: `--help`, `--version` and the commands that read reports
(`kernels summarize|compare|timeline`, `memory summarize|compare`, HTML pages included) never import torch,
triton or matplotlib (drawn only for a PNG), every command's `--help` imports neither pandas nor numpy either, and
the top-level help lists each command under the question it answers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest

from profiler_kit.cli import COMMANDS, QUESTIONS, main

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
BF16 = FIXTURES / "kernels" / "h100_tiny_train_bf16.sqlite"
FP32 = FIXTURES / "kernels" / "h100_tiny_train_fp32.sqlite"
SNAPSHOT = next((FIXTURES / "memory").glob("*.pickle"))

# Runs the CLI in a fresh interpreter and prints which heavy packages it imported.
PROBE = """
import json, sys
from profiler_kit.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'triton', 'matplotlib', 'pandas', 'numpy'})
print(json.dumps({'code': code, 'heavy': heavy}), file=sys.stderr)
"""


def _probe(*args: str, cwd: Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE, *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=120)
    return json.loads(proc.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize("args", [
    ["--help"],
    ["--version"],
    ["kernels", "--help"],
    ["memory", "--help"],
    ["kernels", "summarize", BF16],
    ["kernels", "summarize", BF16, "--format", "json"],
    ["kernels", "compare", FP32, BF16],
    ["kernels", "summarize", BF16, "--html", "page.html"],
    ["kernels", "compare", FP32, BF16, "--html", "page.html"],
    ["kernels", "timeline", BF16, "-o", "trace.json"],
    ["memory", "summarize", SNAPSHOT],
    ["memory", "compare", SNAPSHOT, SNAPSHOT],
], ids=lambda args: " ".join(str(a) if not isinstance(a, Path) else a.name for a in args))
def test_no_torch_on_start_and_report_commands(args: list, tmp_path: Path) -> None:
    result = _probe(*args, cwd=tmp_path)
    assert result["code"] == 0 and not {"torch", "triton", "matplotlib"} & set(result["heavy"])


def _command_paths(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and subcommand under `group`, as the words that name it."""
    ctx = click.Context(group)
    paths = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        paths.append((*path, name))
        if isinstance(command, click.Group):
            paths += _command_paths(command, (*path, name))
    return paths


def test_every_command_is_listed_for_the_help_check() -> None:
    assert {"attention bench", "kernels whatif", "memory compare", "nsys attention", "precision"} <= {
        " ".join(p) for p in _command_paths(main)}


@pytest.mark.parametrize("path", _command_paths(main), ids=" ".join)
def test_every_help_starts_without_heavy_imports(path: tuple[str, ...], tmp_path: Path) -> None:
    assert _probe(*path, "--help", cwd=tmp_path) == {"code": 0, "heavy": []}


def test_the_top_level_help_lists_every_command_by_its_question_without_loading_them() -> None:
    """Each entry of `--help` starts with the words of a real command (the top-level ones loaded only here), and
    every top-level command is listed."""
    listed = {words.split()[0] for _question, entries in QUESTIONS for words, _line in entries}
    assert listed == set(COMMANDS)
    for _question, entries in QUESTIONS:
        for words, _line in entries:
            command = main
            for word in (w for w in words.split() if not w.startswith("-") and w != "CMD"):
                command = command.get_command(click.Context(command), word)
                assert command is not None, words
