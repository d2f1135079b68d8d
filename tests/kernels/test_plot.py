"""`kernels summarize|compare --plot FILE.png`: the figure's bars are the charts' numbers (read back from the
matplotlib objects), stacked segments sit on each other, axes carry their units, the PNG decodes at the
figure's size, and the file follows the output rules (an existing one only with -f, never an input)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from profiler_kit.cli import main
from profiler_kit.kernels import compare, summarize
from profiler_kit.kernels.charts import compare_charts, rank_charts, summary_charts
from profiler_kit.kernels.plot import DPI, PANEL_HEIGHT_IN, WIDTH_IN, figure
from profiler_kit.kernels.ranks import rank_traces, summarize_ranks

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernels"
MLP = FIXTURES / "h100_example_mlp.sqlite"
EXAMPLE = FIXTURES.parents[2] / "profiles" / "examples" / "small_ctx128_train_bf16.sqlite"
RANKS = [FIXTURES / "cpu_ddp2_gloo.rank0.json.gz", FIXTURES / "cpu_ddp2_gloo.rank1.json.gz"]
FP32, BF16 = FIXTURES / "h100_tiny_train_fp32.sqlite", FIXTURES / "h100_tiny_train_bf16.sqlite"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run(*args: object):
    return CliRunner().invoke(main, [*map(str, args)])


def drawn_bars(ax) -> dict[tuple[str, str], list[tuple[float, float, float]]]:
    """(bar, segment) → (x centre, bottom, height) of each rectangle drawn for it, read from the Axes."""
    bars: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    for container in ax.containers:
        for patch in container.patches:
            bar, segment = patch.get_gid().split("|")
            bars.setdefault((bar, segment), []).append(
                (patch.get_x() + patch.get_width() / 2, patch.get_y(), patch.get_height()))
    return bars


def check_panel(ax, chart) -> None:
    """Each rectangle of `ax` is the chart's value, at its bar's place, on top of the segment below it."""
    positions = chart.bar_positions()
    bars = drawn_bars(ax)
    assert len(bars) == len(chart.bars) * len(chart.segments)
    for b, bar in enumerate(chart.bars):
        bottom = np.zeros(len(chart.groups))
        for s, segment in enumerate(chart.segments):
            x, y, h = map(np.array, zip(*bars[(bar, segment)], strict=True))
            np.testing.assert_allclose(x, positions[:, b])
            np.testing.assert_allclose(y, bottom)
            np.testing.assert_allclose(h, chart.values[:, b, s])
            bottom = bottom + h
        np.testing.assert_allclose(bottom, chart.totals()[:, b])
    assert ax.get_ylabel() == chart.y_label and ax.get_ylabel().endswith("(ms)")
    assert ax.get_ylim()[1] >= chart.totals().max()
    assert ax.get_title(loc="left") == chart.title


@pytest.mark.parametrize("make", [
    lambda: summary_charts(summarize(MLP)),
    lambda: rank_charts(summarize_ranks(rank_traces(RANKS))),
    lambda: compare_charts(compare(summarize(FP32), summarize(BF16))),
], ids=["summary", "ranks", "compare"])
def test_figure_draws_the_charts_numbers(make):
    charts = make()
    fig = figure(charts, "title")
    axes = [ax for ax in fig.axes if ax.containers]
    assert len(axes) == len(charts) == 2
    for ax, chart in zip(axes, charts, strict=True):
        check_panel(ax, chart)
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert [label for label, _ in chart.legend()] == legend[:len(chart.legend())]


def test_step_panel_has_the_idle_share_on_its_own_axis():
    charts = summary_charts(summarize(MLP))
    fig = figure(charts, "t")
    twin = [ax for ax in fig.axes if not ax.containers]
    assert len(twin) == 1 and twin[0].get_ylabel() == "GPU idle (%)" and twin[0].get_ylim() == (0, 100)
    (line,) = twin[0].get_lines()
    np.testing.assert_array_equal(line.get_ydata(), charts[1].line)


def test_group_names_are_thinned_and_turned_when_many():
    charts = summary_charts(summarize(MLP))
    steps = charts[1]
    many = type(steps)(steps.title, [f"step number {i}" for i in range(90)], steps.bars, steps.segments,
                       np.ones((90, 2, 1)), steps.colors, steps.y_label)
    ax = figure([many], "t").axes[0]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels == [f"step number {i}" for i in range(0, 90, 3)]
    assert all(t.get_rotation() == 30 for t in ax.get_xticklabels())


@pytest.mark.parametrize(("args", "panels"), [
    ([EXAMPLE], 1),
    ([MLP], 2),
    (RANKS, 2),
    (["compare", FP32, BF16], 2),
], ids=["example", "steps", "ranks", "compare"])
def test_cli_writes_a_png_of_the_figure_size(tmp_path, args, panels):
    from matplotlib.image import imread

    png = tmp_path / "out.png"
    command = ["kernels", *(args if args[0] == "compare" else ["summarize", *args])]
    result = run(*command, "--plot", png, "--format", "json")
    assert result.exit_code == 0, result.output
    assert result.stdout.lstrip().startswith("{") and f"wrote {png}" in result.stderr
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size < 200_000
    height, width, _ = imread(png).shape
    assert (width, height) == (WIDTH_IN * DPI, round((0.5 + panels * PANEL_HEIGHT_IN) * DPI))


def test_cli_outputs_follow_the_output_rules(tmp_path):
    png, page = tmp_path / "p.png", tmp_path / "p.html"
    png.write_text("earlier")
    refused = run("kernels", "summarize", MLP, "--plot", png)
    assert refused.exit_code == 2 and "-f/--force" in refused.stderr and png.read_text() == "earlier"
    assert refused.stdout == ""  # refused before any work
    assert run("kernels", "summarize", MLP, "--plot", png, "--html", page, "-f").exit_code == 0
    assert png.read_bytes()[:8] == PNG_MAGIC and page.read_text().startswith("<!DOCTYPE html>")
    copy = tmp_path / MLP.name
    copy.write_bytes(MLP.read_bytes())
    for flag in ("--plot", "--html"):
        result = run("kernels", "summarize", copy, flag, copy, "-f")
        assert result.exit_code == 2 and "is an input" in result.stderr
        result = run("kernels", "compare", FP32, copy, flag, copy, "-f")
        assert result.exit_code == 2 and "is an input" in result.stderr
    assert copy.read_bytes() == MLP.read_bytes()
    same = run("kernels", "compare", FP32, BF16, "--plot", png, "--html", png, "-f")
    assert same.exit_code == 2 and "same file" in same.stderr


def test_readme_shows_one_committed_picture_per_kind():
    from matplotlib.image import imread

    repo = EXAMPLE.parents[2]
    readme = (repo / "README.md").read_text()
    for name in ("kernels_phases", "kernels_ranks", "kernels_compare", "memory"):
        png = repo / "docs" / "img" / f"{name}.png"
        assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size < 200_000
        height, width, _ = imread(png).shape
        assert width >= 1000 and height >= 450
        assert f"](docs/img/{name}.png)" in readme
