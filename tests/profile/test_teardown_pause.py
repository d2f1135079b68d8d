"""The recorder's pause before a program closes its process group comes before the group is torn down: a one-rank
gloo program under `profiler-kit nsys --backend torch` sees it while its group still exists."""

from __future__ import annotations

import sys
import textwrap

from click.testing import CliRunner

from profiler_kit.cli import main

PROGRAM = """
import time
import torch
import torch.distributed as dist

torch.ones(4) + 1
dist.init_process_group("gloo", rank=0, world_size=1, init_method="file://{store}")
seen = []
sleep = time.sleep


def watched(seconds):
    seen.append(dist.is_initialized())
    sleep(seconds)


time.sleep = watched
dist.destroy_process_group()
time.sleep = sleep
print("paused with the group up:", seen, "after:", dist.is_initialized())
"""


def test_the_pause_comes_while_the_group_is_still_up(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(PROGRAM.format(store=tmp_path / "store")))
    result = CliRunner().invoke(main, ["nsys", "--backend", "torch", "-o", str(tmp_path / "run"), "--", sys.executable,
                                       str(script)])
    assert result.exit_code == 0, result.output
    assert "paused with the group up: [True] after: False" in result.stderr, result.stderr
