"""What people and programs read: tables that fit the width with unique headers, one CSV table that pandas
reads, Markdown and tables that show names from data literally (markup, escape codes, newlines)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from profiler_kit.cli import main
from profiler_kit.cli.benchmark import DISPLAY_COLUMNS, display_rows
from profiler_kit.render import emit_tables, to_markdown

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
BF16 = FIXTURES / "kernels" / "h100_tiny_train_bf16.sqlite"
FP32 = FIXTURES / "kernels" / "h100_tiny_train_fp32.sqlite"
SNAPSHOT = FIXTURES / "memory" / "tiny_ctx128_train_bf16.pickle"
MLP = FIXTURES / "kernels" / "h100_example_mlp.sqlite"

HOSTILE = ["[/x]", "[bold red]x[/bold red]", "evil\x1b]0;title\x07\x1b[2J", "two\nlines", "<unnamed>", "a|b`c`"]
BOX_HEADER = "┃"


def _cli(*args, width: int | None = None):
    env = {"COLUMNS": str(width)} if width else {}
    return CliRunner().invoke(main, [*map(str, args)], env=env)


def _headers(text: str) -> list[list[str]]:
    """The header cells of every boxed table in `text`."""
    return [[cell.strip() for cell in line.split(BOX_HEADER)[1:-1]]
            for line in text.splitlines() if line.startswith(BOX_HEADER)]


@pytest.mark.parametrize("width", [80, 120, 200])
@pytest.mark.parametrize("args", [
    ["kernels", "summarize", BF16],
    ["kernels", "compare", FP32, BF16],
    ["memory", "summarize", SNAPSHOT],
    ["models"],
], ids=lambda a: " ".join(str(x)[-30:] for x in a) if isinstance(a, list) else str(a))
def test_tables_fit_the_width_with_unique_whole_headers(args, width):
    result = _cli(*args, width=width)
    assert result.exit_code == 0, result.output
    _assert_fits(result.stdout, width)


def _assert_fits(text: str, width: int) -> None:
    assert max(map(len, text.splitlines())) <= width
    headers = _headers(text)
    assert headers
    for row in headers:
        assert len(set(row)) == len(row), row
        assert all(cell and "…" not in cell for cell in row), row


@pytest.fixture(scope="module")
def benchmark_rows() -> pd.DataFrame:
    """Rows of a real benchmark run of the tiny model (forward and train) on the CPU."""
    result = _cli("benchmark", "--model", "tiny", "--ctx", "8", "--mode", "forward,train", "--batch-size", "1",
                  "--device", "cpu", "--warmup", "0", "--max-warmup", "0", "--steps", "2", "--format", "json")
    assert result.exit_code == 0, result.output
    return pd.DataFrame(json.loads(result.stdout)["results"])


@pytest.mark.parametrize("width", [80, 120, 200])
def test_the_benchmark_table_fits_with_its_main_columns(benchmark_rows, capsys, monkeypatch, width):
    monkeypatch.setenv("COLUMNS", str(width))
    emit_tables([("benchmark", display_rows(benchmark_rows))], "table")
    out = capsys.readouterr().out
    _assert_fits(out, width)
    if width >= 120:
        assert _headers(out)[0] == DISPLAY_COLUMNS


def test_wide_and_columns_choose_what_a_table_shows():
    wide = _cli("kernels", "summarize", BF16, "--wide", width=80)
    assert max(map(len, wide.stdout.splitlines())) > 80
    picked = _cli("kernels", "summarize", BF16, "--columns", "phase,total_ms", width=80)
    assert ["phase", "total_ms"] in _headers(picked.stdout)
    unknown = _cli("kernels", "summarize", BF16, "--columns", "nope")
    assert unknown.exit_code == 2 and "nope" in unknown.stderr


def test_thousands_separators_from_1000_in_every_column(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    emit_tables([("t", pd.DataFrame({"count": [999, 1000, 28630], "ms": [999.0, 8582.0, 28630.0]}))], "table")
    out = capsys.readouterr().out
    assert "1,000" in out and "8,582" in out and "28,630" in out and " 999 " in out


@pytest.mark.parametrize("fmt", ["table", "markdown"])
def test_names_from_data_are_printed_literally(capsys, monkeypatch, fmt):
    monkeypatch.setenv("COLUMNS", "200")
    df = pd.DataFrame({"name": HOSTILE, "total_ms": [1.0] * len(HOSTILE)})
    emit_tables([("[bold]title[/bold] \x1b[31m", df)], fmt, caption="note: [/x] \x1b[2J")
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    escape = "\\\\" if fmt == "markdown" else "\\"  # Markdown escapes the backslash itself
    assert f"{escape}x1b]0;title{escape}x07{escape}x1b[2J" in out and f"two{escape}nlines" in out
    assert "[bold red]x[/bold red]" in out and "[/x]" in out
    assert fmt == "markdown" or "[bold]title[/bold]" in out  # Markdown titles only several tables
    if fmt == "markdown":
        rows = [line for line in out.splitlines() if line.startswith("| ")]
        assert len(rows) == 1 + len(HOSTILE)  # a newline in a name does not break its row
        assert "\\<unnamed\\>" in out and "a\\|b\\`c\\`" in out
        assert all(len(re.split(r"(?<!\\)\|", row)) == 4 for row in rows)  # header and rows: two cells each


def test_markdown_escapes_the_characters_that_change_its_meaning():
    text = to_markdown(pd.DataFrame({"kernel": ["<unnamed>", "x|y", "`code`"]}))
    assert "\\<unnamed\\>" in text and "x\\|y" in text and "\\`code\\`" in text


def test_error_line_escapes_control_characters_and_markup(tmp_path):
    bad = tmp_path / "evil\x1b[2J[/x].sqlite"
    result = _cli("kernels", "summarize", bad)
    assert result.exit_code == 1
    assert "\x1b" not in result.stderr and "\\x1b[2J[/x]" in result.stderr
    assert result.stderr.startswith("Error: ") and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args", [
    ["models"],
    ["kernels", "summarize", BF16],
    ["kernels", "compare", FP32, BF16],
    ["memory", "summarize", SNAPSHOT],
    ["memory", "compare", SNAPSHOT, SNAPSHOT],
    ["benchmark", "--model", "tiny", "--ctx", "8", "--mode", "forward", "--batch-size", "1", "--device", "cpu",
     "--warmup", "0", "--max-warmup", "0", "--steps", "1"],
    ["kernels", "whatif", MLP],
    ["attention", "bench", "--impl", "naive,flash-torch", "--batch", "1", "--heads", "1", "--seq", "16", "--d", "16",
     "--dtype", "fp32", "--device", "cpu", "--warmup", "1", "--rep", "1"],
], ids=lambda a: " ".join(str(x)[-20:] for x in a[:3]))
def test_csv_round_trips_through_pandas_and_json_has_the_envelope(args):
    result = _cli(*args, "--format", "csv")
    assert result.exit_code == 0, result.output
    table = pd.read_csv(io.StringIO(result.stdout))
    assert len(table) and not any(str(c).startswith("#") for c in table.columns)
    document = json.loads(_cli(*args, "--format", "json").stdout)
    assert document["schema_version"] >= 1 and document["environment"]["profiler_kit"]
    assert _cli(*args, "--format", "md").exit_code == 0
