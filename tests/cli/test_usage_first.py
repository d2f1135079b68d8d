"""`--table` and `--columns` are usage errors refused before any work (exit 2, nothing read, nothing run, nothing
printed but the error), against the tables and columns each command can print; and those declared names hold
every table and column that real reports print."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from profiler_kit.cli import main
from profiler_kit.names import (
    COMPARE_TABLES,
    MEMORY_COMPARE_TABLES,
    MEMORY_REPORT_TABLES,
    SUMMARY_TABLES,
    WHATIF_TABLES,
    report_column,
)
from profiler_kit.render import table_name

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
KERNELS = FIXTURES / "kernels"
MEMORY = FIXTURES / "memory"
MISSING = REPO / "no-such-report.sqlite"


def _cli(*args: object):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.mark.parametrize("command", [
    ["kernels", "summarize", MISSING],
    ["kernels", "compare", MISSING, MISSING],
    ["kernels", "whatif", MISSING],
    ["memory", "summarize", MISSING],
    ["memory", "compare", MISSING, MISSING],
    ["nsys", "--backend", "torch", "--", "python", MISSING],
    ["memory", "--", "python", MISSING],
], ids=lambda c: " ".join(str(w) for w in c[:2]))
@pytest.mark.parametrize("option", [["--format", "csv", "--table", "bogus"], ["--columns", "total_ms,bogus"]],
                         ids=["table", "columns"])
def test_an_unknown_table_or_column_is_refused_before_the_input_is_read(command, option):
    at = command.index("--") if "--" in command else len(command)
    result = _cli(*command[:at], *option, *command[at:])
    assert result.exit_code == 2, result.output
    assert result.stdout == "" and "bogus" in result.stderr.splitlines()[-1]
    assert str(MISSING) not in result.stderr  # the error is the option's, not the missing input's


def test_a_recording_refuses_a_bad_table_before_the_program_runs(tmp_path):
    marker = tmp_path / "ran"
    script = tmp_path / "prog.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    result = _cli("nsys", "--backend", "torch", "-o", tmp_path / "out", "--format", "csv", "--table", "nope",
                  "--", sys.executable, script)
    assert result.exit_code == 2 and "--table 'nope': choose one of categories" in result.stderr
    assert not marker.exists() and not list(tmp_path.glob("out*"))


def test_a_table_the_command_has_but_this_report_lacks_is_refused_before_anything_is_printed():
    result = _cli("kernels", "summarize", KERNELS / "h100_tiny_train_bf16.sqlite", "--format", "csv", "--table",
                  "arrivals")
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.splitlines()[-1].startswith("Error: --table 'arrivals': this report has no such table")
    assert "note:" not in result.stderr


def _reports() -> dict:
    """Every kind of report from real recordings: (the tables its command declares, the report)."""
    from profiler_kit.kernels import compare, load, summarize, summarize_trace
    from profiler_kit.kernels.ranks import rank_traces, summarize_ranks
    from profiler_kit.kernels.whatif import what_if
    from profiler_kit.memory import analyze_file
    from profiler_kit.memory import compare as memory_compare
    from profiler_kit.memory.ranks import merge, rank_peak

    fp32, bf16 = KERNELS / "h100_tiny_train_fp32.sqlite", KERNELS / "h100_tiny_train_bf16.sqlite"
    snapshots = [analyze_file(MEMORY / f"tiny_ctx128_train{suffix}.pickle") for suffix in ("", "_bf16")]
    return {
        "gpu": (SUMMARY_TABLES, summarize(REPO / "profiles" / "examples" / "small_ctx128_train_bf16.sqlite")),
        "nvtx": (SUMMARY_TABLES, summarize(bf16, nvtx="forward")),
        "cpu": (SUMMARY_TABLES, summarize(KERNELS / "cpu_example_mlp_torch.json.gz")),
        "steps": (SUMMARY_TABLES, summarize(KERNELS / "h100_ddp1_torch.rank0.json.gz")),
        "cpu ranks": (SUMMARY_TABLES, summarize_ranks(rank_traces(sorted(KERNELS.glob("cpu_ddp2_gloo.rank*"))))),
        "gpu ranks": (SUMMARY_TABLES, summarize_ranks(rank_traces([KERNELS / "gpu2_ddp_nccl.sqlite"]))),
        "compare": (COMPARE_TABLES, compare([summarize(fp32)] * 2, [summarize(bf16)] * 2, fail_above_pct=1)),
        "whatif": (WHATIF_TABLES, what_if(summarize_trace(load(KERNELS / "h100_example_mlp.sqlite")), [])),
        "memory": (MEMORY_REPORT_TABLES, snapshots[1]),
        "memory ranks": (MEMORY_REPORT_TABLES, merge([rank_peak(s, i) for i, s in enumerate(snapshots)])),
        "memory compare": (MEMORY_COMPARE_TABLES, memory_compare(*snapshots)),
    }


def test_the_declared_tables_and_columns_hold_every_real_report_s():
    for kind, (declared, report) in _reports().items():
        for display in (False, True):
            for title, frame in report.tables(display=display):
                assert table_name(title) in declared, (kind, title)
                columns = getattr(frame, "frame", frame).columns
                assert all(report_column(str(c)) for c in columns), (kind, title, list(columns))
    assert not report_column("bogus") and report_column("fwd_ms") and report_column("matmul_pct")
