"""`kernels summarize|compare --html FILE.html`: one self-contained page whose bars carry the report's numbers
(each phase's categories, each step's times, each rank's phases, A and B), whose tables are the report's tables
cell for cell, and which loads nothing (a policy forbids any load; no script, link or source attribute)."""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner

from profiler_kit.cli import main
from profiler_kit.kernels import compare, summarize
from profiler_kit.kernels.ranks import rank_traces, summarize_ranks
from profiler_kit.kernels.summary import NS_PER_MS
from profiler_kit.render import Shown, format_cell
from profiler_kit.webpage import CONTENT_POLICY, nice_ticks

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernels"
MLP = FIXTURES / "h100_example_mlp.sqlite"
RANKS = [FIXTURES / "cpu_ddp2_gloo.rank0.json.gz", FIXTURES / "cpu_ddp2_gloo.rank1.json.gz"]
FP32, BF16 = FIXTURES / "h100_tiny_train_fp32.sqlite", FIXTURES / "h100_tiny_train_bf16.sqlite"


class Page(HTMLParser):
    """The charts (title → bars, idle points) and the tables (rows of cell texts) of a page."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.charts: dict[str, list[dict[str, str]]] = {}
        self.idle: list[dict[str, str]] = []
        self.tables: list[list[list[str]]] = []
        self.tags: set[str] = set()
        self._chart: str | None = None
        self._cell: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.add(tag)
        if tag == "svg" and attrs.get("class") == "chart":
            self._chart = attrs["data-title"]
            self.charts[self._chart] = []
        elif tag == "rect" and attrs.get("class") == "bar":
            self.charts[self._chart].append(attrs)
        elif tag == "circle" and attrs.get("class") == "idle":
            self.idle.append(attrs)
        elif tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.tables[-1][-1].append("".join(self._cell))
            self._cell = None


def bars_of(page: Page, title_start: str) -> dict[tuple[str, str, str], float]:
    (title,) = [t for t in page.charts if t.startswith(title_start)]
    return {(b["data-group"], b["data-bar"], b["data-segment"]): float(b["data-ms"]) for b in page.charts[title]}


def write(tmp_path: Path, *args: object) -> Page:
    out = tmp_path / "report.html"
    result = CliRunner().invoke(main, [*map(str, args), "--html", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text(encoding="utf-8")
    assert_self_contained(text)
    return Page(text)


def assert_self_contained(text: str) -> None:
    assert text.startswith("<!DOCTYPE html>")
    assert f'content="{html.escape(CONTENT_POLICY)}"' in text
    assert not re.search(r"<script|<link|<img|<iframe|<object|@import|url\(|\b(src|href)\s*=", text, re.I)
    assert not re.findall(r"https?://", text)


def assert_tables(page: Page, report) -> None:
    """The page's tables are the report's, every column, each cell as the terminal writes it."""
    tables = report.tables()
    assert len(page.tables) == len(tables)
    for got, (_, table) in zip(page.tables, tables, strict=True):
        df = table.frame if isinstance(table, Shown) else table
        assert got[0] == [str(c) for c in df.columns]
        assert got[1:] == [[format_cell(v, str(c)) for v, c in zip(row, df.columns, strict=True)]
                           for row in df.itertuples(index=False)]


def test_summary_page_bars_are_the_phase_and_step_figures(tmp_path):
    page = write(tmp_path, "kernels", "summarize", MLP)
    summary = summarize(MLP)
    bars = bars_of(page, "Kernel time per phase")
    expected = {(phase, "", category): ns / NS_PER_MS for phase, figures in summary.phase_ns().items()
                for category, ns in figures["categories"].items() if ns}
    assert {k: v for k, v in bars.items() if v} == pytest.approx(expected, rel=1e-12)
    steps = bars_of(page, "Per step")
    for row in summary.steps.itertuples(index=False):
        assert steps[(str(row.step), "wall time", "")] == row.wall_ms
        assert steps[(str(row.step), "kernel time", "")] == row.kernel_ms
    assert [float(p["data-pct"]) for p in page.idle] == summary.steps["idle_pct"].tolist()
    assert_tables(page, summary)


def test_rank_page_has_a_bar_group_per_rank(tmp_path):
    page = write(tmp_path, "kernels", "summarize", *RANKS)
    ranked = summarize_ranks(rank_traces(RANKS))
    bars = bars_of(page, "CPU operator self time per rank and phase")
    assert {g for g, _, _ in bars} == {"rank 0", "rank 1"}
    for member in ranked.members:  # each rank's time by phase and category over the steady steps
        for phase, row in member.figures.by_phase.iterrows():
            for category, ns in row[row > 0].items():
                assert bars[(f"rank {member.rank}", phase, category)] == pytest.approx(ns / NS_PER_MS, rel=1e-12)
    walls = bars_of(page, "Wall time of each phase per rank")
    table = ranked.rank_table()
    for row in table.to_dict("records"):
        for phase in ranked.phase_names:
            assert walls[(f"rank {row['rank']}", phase, "")] == row[f"{phase}_wall_ms"]
    assert_tables(page, ranked)


def test_compare_page_has_a_beside_b(tmp_path):
    page = write(tmp_path, "kernels", "compare", FP32, BF16)
    comparison = compare(summarize(FP32), summarize(BF16))
    bars = bars_of(page, "A against B by category")
    for row in comparison.category_table().query("category != 'total'").itertuples(index=False):
        assert (bars[(row.category, "A", "")], bars[(row.category, "B", "")]) == (row.a_ms, row.b_ms)
    phases = bars_of(page, "A against B per phase")
    for row in comparison.phase_table().itertuples(index=False):
        assert (phases[(row.phase, "A", "")], phases[(row.phase, "B", "")]) == (row.a_ms, row.b_ms)
    assert_tables(page, comparison)


def test_axis_ticks_are_round_and_reach_the_tallest_bar():
    assert nice_ticks(9.3) == [0, 2, 4, 6, 8, 10]
    assert nice_ticks(0.42) == pytest.approx([0, 0.1, 0.2, 0.3, 0.4, 0.5])
    assert nice_ticks(1500) == [0, 500, 1000, 1500]
    assert nice_ticks(0) == [0.0, 1.0]
