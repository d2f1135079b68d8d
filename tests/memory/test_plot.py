"""The memory timeline's phase labels (PNG and HTML) never overlap, however many phases and however long their
names: each is centred over its band in the first row where it clears the others, the widest phases first; a
phase whose label fits nowhere keeps its band unlabelled. Memory is drawn in MiB, as the tables give it."""

from __future__ import annotations

import dataclasses
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from profiler_kit.memory import analyze_file
from profiler_kit.memory.analyze import MIB
from profiler_kit.memory.html import CHAR_PX, timeline_svg
from profiler_kit.memory.phases import Phases, PhaseSpan
from profiler_kit.memory.plot import LABEL_GAP, LABEL_ROWS, label_box, place_labels, span_label, timeline_figure

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "memory_snapshots" / "examples" / "plain_adamw_fused.pickle"
RECORDER = REPO / "tests" / "fixtures" / "memory" / "tiny_ctx128_train.pickle"


def overlapping(boxes: list[tuple[float, float]]) -> list[tuple[int, int]]:
    return [(i, j) for i in range(len(boxes)) for j in range(i + 1, len(boxes))
            if boxes[i][0] < boxes[j][1] and boxes[j][0] < boxes[i][1]]


def test_labels_in_one_row_never_overlap_and_the_widest_spans_go_first():
    # Three wide spans with short labels, and four thin spans between two of them whose labels are wider.
    extents = [(0, 300), (300, 302), (302, 304), (304, 306), (306, 308), (308, 600), (600, 900)]
    widths = [60, 200, 200, 200, 200, 60, 60]
    rows = place_labels(extents, widths, 0, 900, rows=2, gap=4)
    assert rows == [0, 0, 1, None, None, 0, 0]
    for row in range(2):
        boxes = [label_box(e, w, 0, 900) for e, w, r in zip(extents, widths, rows, strict=True) if r == row]
        assert not overlapping([(a - 2, b + 2) for a, b in boxes])
        assert all(0 <= a and b <= 900 for a, b in boxes)
    # With one row, the first thin span's label is the only one between the wide spans'.
    assert place_labels(extents, widths, 0, 900, rows=1, gap=4) == [0, 0, None, None, None, 0, 0]
    # A label is shifted to stay inside the plot; one wider than the plot starts at its left edge.
    assert label_box((880, 900), 60, 0, 900) == (840, 900) and label_box((0, 10), 60, 0, 900) == (0, 60)
    assert label_box((0, 10), 50, 0, 30) == (0, 50)


def figure_labels(fig) -> list[tuple[str, tuple[float, float, float, float]]]:
    """(text, pixel box) of each phase label drawn on the timeline."""
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    return [(t.get_text(), tuple(t.get_window_extent(renderer).bounds)) for t in ax.texts]


def assert_apart(labels) -> None:
    boxes = [(x, y, x + w, y + h) for _, (x, y, w, h) in labels]
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            a, b = boxes[i], boxes[j]
            assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], (labels[i], labels[j])


def test_example_png_labels_apart_and_memory_in_mib():
    report = analyze_file(EXAMPLE)
    fig = timeline_figure(report.recon, report.roles, report.spans, "t")
    labels = figure_labels(fig)
    drawn = [span_label(s) for s in report.spans if s.end > s.start]
    assert labels and {text for text, _ in labels} <= set(drawn)
    assert_apart(labels)
    # The forward and backward of both steps, the widest bands, are named.
    assert {"step 0, forward", "step 0, backward", "step 1, forward", "step 1, backward"} <= {
        text for text, _ in labels}
    ax = fig.axes[0]
    assert ax.get_ylabel() == "memory (MiB)"
    assert ax.get_ylim()[1] >= report.recon.peak_reserved_bytes / MIB
    assert any(f"{report.recon.peak_allocated_bytes / MIB:,.1f} MiB" in t.get_text()
               for t in ax.get_legend().get_texts())


def many_phases(report, steps: int) -> list[PhaseSpan]:
    """`steps` steps of forward, backward and a thin optimizer step over the report's trace, labelled by step."""
    n = report.recon.n_entries
    spans, per_step = [], n // steps
    for step in range(steps):
        start = step * per_step
        cuts = [start, start + per_step * 3 // 10, start + per_step * 9 // 10, start + per_step]
        for a, b, phase in zip(cuts, cuts[1:], ("forward", "backward", "optimizer_step"), strict=False):
            spans.append(PhaseSpan(f"step {step + 1}, {phase}", a, b))
    return spans


@pytest.mark.parametrize("steps", [2, 8, 40])
def test_many_phases_get_labels_that_never_overlap(steps):
    report = analyze_file(RECORDER)
    spans = many_phases(report, steps)
    fig = timeline_figure(report.recon, report.roles, spans, "t")
    labels = figure_labels(fig)
    assert_apart(labels)
    shown = {t for t, _ in labels}
    assert shown <= {s.label for s in spans}
    if steps <= 8:  # the backward of every step, its widest band, is named
        assert {f"step {k + 1}, backward" for k in range(steps)} <= shown
    else:  # a label 110 px wide for a band of 17: labels of one row apart, a row's worth at least
        assert len(labels) >= 10


class SvgLabels(HTMLParser):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.labels: list[dict] = []
        self._open: dict | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "text" and attrs.get("class") == "phase-label":
            self._open = {"x": float(attrs["x"]), "y": float(attrs["y"])}

    def handle_data(self, data):
        if self._open is not None:
            self._open["text"] = data
            self.labels.append(self._open)
            self._open = None


@pytest.mark.parametrize("steps", [None, 8, 40])
def test_html_timeline_labels_never_overlap(steps):
    report = analyze_file(EXAMPLE if steps is None else RECORDER)
    if steps is not None:
        report = dataclasses.replace(report, placed=Phases(many_phases(report, steps), []))
    svg = timeline_svg(report)
    labels = SvgLabels(svg).labels
    assert labels and len({label["y"] for label in labels}) <= LABEL_ROWS
    for y in {label["y"] for label in labels}:
        row = [label for label in labels if label["y"] == y]
        boxes = [(lb["x"] - len(lb["text"]) * CHAR_PX / 2, lb["x"] + len(lb["text"]) * CHAR_PX / 2) for lb in row]
        assert not overlapping([(a + LABEL_GAP / 2 - 0.1, b - LABEL_GAP / 2 + 0.1) for a, b in boxes])
    # Every band keeps its name as a tooltip, labelled or not.
    titles = re.findall(r'<rect class="phase"[^>]*><title>([^<]*)</title>', svg)
    assert titles == [span_label(s) for s in report.spans if s.end > s.start]
    assert "memory (MiB)" in svg
