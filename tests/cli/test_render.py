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
from profiler_kit.render import Shown, emit_tables, shorten_middle, to_markdown

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
    """The header cells of every boxed table in `text`, a header on several lines joined again."""
    return [headers for headers, _rows in _boxed(text)]


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


SMALL = Path(__file__).resolve().parents[2] / "profiles" / "examples" / "small_ctx128_train_bf16.sqlite"
CPU_TRACE = FIXTURES / "kernels" / "cpu_example_mlp_torch.json.gz"
DDP_TORCH = FIXTURES / "kernels" / "h100_ddp1_torch.rank0.json.gz"
PYTORCH_PHASES = ("Optimizer.step#AdamW.step", "Optimizer.zero_grad#AdamW.zero_grad", "fwd")


def _boxed(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """The header cells (a header broken over lines joined again) and the row cells of every boxed table in
    `text`, in order."""
    tables: list[tuple[list[str], list[list[str]]]] = []
    in_header = False
    for line in text.splitlines():
        if line.startswith(BOX_HEADER):
            cells = [c.strip() for c in line.split(BOX_HEADER)[1:-1]]
            if in_header:
                tables[-1] = ([a + b for a, b in zip(tables[-1][0], cells, strict=True)], [])
            else:
                tables.append((cells, []))
            in_header = True
        else:
            in_header = False
            if line.startswith("│") and tables:
                tables[-1][1].append([c.strip() for c in line.split("│")[1:-1]])
    return tables


def _reports() -> dict:
    """Each report kind on real recordings: a GPU report with long kernel names, a CPU trace with PyTorch's range
    names as phases, a GPU trace with steps and idle, a comparison and a what-if."""
    from profiler_kit.kernels import compare, load, summarize, summarize_trace
    from profiler_kit.kernels.whatif import what_if

    return {
        "gpu": lambda: summarize(SMALL),
        "cpu": lambda: summarize(CPU_TRACE, phases=list(PYTORCH_PHASES)),
        "steps": lambda: summarize(DDP_TORCH),
        "compare": lambda: compare([summarize(FP32)], [summarize(BF16)]),
        "whatif": lambda: what_if(summarize_trace(load(MLP)), []),
    }


@pytest.mark.parametrize("width", [80, 120, 200])
@pytest.mark.parametrize("kind", ["gpu", "cpu", "steps", "compare", "whatif"])
def test_narrow_tables_keep_their_key_columns_and_cut_a_name_once(kind, width, capsys, monkeypatch):
    from profiler_kit.render import OutputFormat, emit_report, format_cell

    monkeypatch.setenv("COLUMNS", str(width))
    report = _reports()[kind]()
    emit_report(report, OutputFormat("table"))
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= width
    tables = report.tables(display=True)
    shown = _boxed(out)
    assert len(shown) == len(tables)
    for (title, table), (headers, rows) in zip(tables, shown, strict=True):
        df = table.frame if isinstance(table, Shown) else table
        key = [str(df.columns[0]), *(c for c in title.key if c in df.columns)]
        assert set(key) <= set(headers), (title, headers)
        for column in headers:
            if pd.api.types.is_numeric_dtype(df[column]):
                continue
            at = headers.index(column)
            for cell, full in zip((row[at] for row in rows), (format_cell(v, column) for v in df[column]),
                                  strict=True):
                if cell != full:  # cut where `…` is: the name's start, then parts of it in their order
                    pieces = cell.split("…")
                    assert full.startswith(pieces[0]), (column, cell, full)
                    if "…" not in full:  # (a cell that lists names cut already has more `…`)
                        assert len(pieces) in (2, 3), (column, cell, full)
                        pos = len(pieces[0])
                        for piece in pieces[1:]:
                            pos = full.index(piece, pos) + len(piece)
                        assert len(pieces) == 3 or full.endswith(pieces[-1])
                elif column == "phase" and width >= 120:
                    assert cell == full
            cut = [row[0] for row in rows]
            assert len(set(cut)) == len(set(df[df.columns[0]].map(str))), cut  # different names read apart


def test_a_display_name_drops_noise_and_is_never_cut():
    """Tables cut a name to their width themselves: the display name is the whole name less namespaces, casts
    and the parameter list, however long."""
    from profiler_kit.kernels import summarize
    from profiler_kit.kernels.summary import display_name

    names = summarize(SMALL).kernels["name"]
    shown = names.map(display_name)
    assert not shown.str.contains("…").any() and shown.str.len().max() > 200
    adam = next(n for n in names if "LerpFunctor" in n)
    assert display_name(adam) == ("multi_tensor_apply_kernel<TensorListMetadata<2>, TernaryOpScalarFunctor<float, 2, "
                                  "2, 0>, LerpFunctor<float>, float>")
    assert display_name(adam, 40) == shorten_middle(display_name(adam), 40) and len(display_name(adam, 40)) == 40


def test_a_kernel_name_is_as_wide_as_the_table_allows(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    result = _cli("kernels", "summarize", SMALL, width=80)
    headers, rows = _boxed(result.stdout)[1]
    assert headers[:2] == ["name", "category"] and "share_pct" in headers
    border = next(line for line in result.stdout.splitlines() if line.startswith("┃ name"))
    assert len(border) == 80  # the name column takes what the key columns leave
    assert all(len(row[0]) > 30 for row in rows)


def test_notes_are_left_aligned_and_wrapped_between_words():
    from profiler_kit.kernels import summarize

    result = _cli("kernels", "summarize", CPU_TRACE, *(f"--phase={p}" for p in PYTORCH_PHASES), width=80)
    lines = result.stdout.splitlines()
    after = lines[max(i for i, line in enumerate(lines) if line.startswith("└")) + 1:]
    assert after and all(len(line) <= 80 and not line.startswith("   ") for line in after)
    notes, skip = [], False
    for line in after:  # the caption's lines, less the columns the last table leaves out
        skip = line.startswith("not shown") or (skip and line.startswith("  "))
        if not skip:
            notes.append(line.strip())
    joined = " ".join(notes)
    caption = summarize(CPU_TRACE, phases=list(PYTORCH_PHASES)).caption()
    assert joined == " ".join(caption.split("\n"))  # every break was between two words
    assert any(line.startswith("  ") for line in after)  # a wrapped note goes on indented


def test_counts_are_written_one_way_in_tables_and_notes():
    from profiler_kit.kernels import summarize

    summary = summarize(CPU_TRACE)
    result = _cli("kernels", "summarize", CPU_TRACE, width=120)
    assert f"{summary.kernel_count:,} CPU operator calls" in result.stdout and summary.kernel_count >= 1000
    categories = _boxed(result.stdout)[0]
    assert any("," in row[1] for row in categories[1]) or summary.category_table()["operators"].max() < 1000


@pytest.mark.parametrize("source", [BF16, SMALL, CPU_TRACE, DDP_TORCH, MLP])
def test_table_names_are_the_same_whatever_top_and_source(source, tmp_path):
    names = {}
    for top in ("3", "12"):
        folder = tmp_path / top
        result = _cli("kernels", "summarize", source, "--top", top, "--format", "csv", "--csv-dir", folder)
        assert result.exit_code == 0, result.output
        names[top] = sorted(p.stem for p in folder.iterdir())
    assert names["3"] == names["12"]
    assert {"categories", "top_kernels"} <= set(names["3"]) <= {"categories", "top_kernels", "phases", "steps",
                                                                 "idle", "memory_ops"}
    picked = _cli("kernels", "summarize", source, "--top", "3", "--format", "csv", "--table", "top_kernels")
    assert len(pd.read_csv(io.StringIO(picked.stdout))) == 3


@pytest.mark.parametrize("fmt", ["table", "json", "markdown", "csv"])
def test_csv_dir_writes_every_table_with_every_format(fmt, tmp_path):
    result = _cli("kernels", "summarize", BF16, "--format", fmt, "--csv-dir", tmp_path / "t")
    assert result.exit_code == 0 and result.stdout, result.output
    written = {p.stem: pd.read_csv(p) for p in (tmp_path / "t").iterdir()}
    assert set(written) == {"categories", "top_kernels", "phases", "idle", "memory_ops"}
    assert "largest_gaps_us" in written["idle"].columns  # every column, whatever a table shows


def test_table_goes_with_the_csv_format_only():
    result = _cli("kernels", "summarize", BF16, "--table", "phases", "--format", "json")
    assert result.exit_code == 2 and "--format csv" in result.stderr and result.stdout == ""
