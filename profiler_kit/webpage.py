"""The parts every HTML report shares: one self-contained document (inline style, inline SVG, no script), a
Content-Security-Policy that forbids the browser to load anything, and the report's tables as HTML tables.

A page opens on a machine without network access and can never make a request: the policy blocks scripts,
style sheets, fonts, images and frames from anywhere, the page's own inline style excepted."""

from __future__ import annotations

import html
import math
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from profiler_kit.files import replaced_when_complete
from profiler_kit.render import Shown, format_cell

# Nothing may load; the inline <style> is the one exception.
CONTENT_POLICY = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"
TICKS = 5
NUM_CLASS = ' class="num"'
STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; } td { max-width: 60em; overflow-wrap: break-word; }
th { background: #f0f0f0; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.peak { font-size: 1.3em; margin: 0.5em 0 1em; } .note { color: #8a5a00; }
details { margin: 2px 0; font-size: 13px; } pre { margin: 2px 0 6px 1.5em; font-size: 12px; }
svg { display: block; margin: 0.5em 0 1em; } svg text { font-size: 11px; font-family: system-ui, sans-serif; }
"""


def esc(value: object) -> str:
    """Text for HTML content or a quoted attribute."""
    return html.escape(str(value), quote=True)


def nice_ticks(top: float, count: int = TICKS) -> list[float]:
    """Round tick values from 0 up to at least `top`: steps of 1, 2 or 5 times a power of ten."""
    if not math.isfinite(top) or top <= 0:
        return [0.0, 1.0]
    raw = top / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [k * step for k in range(int(math.ceil(top / step - 1e-9)) + 1)]


def tick_text(value: float) -> str:
    """A tick value as an axis shows it: whole numbers with separators from 100 up, else short."""
    return f"{value:,.0f}" if value >= 100 else f"{value:g}"


def table_html(frame: pd.DataFrame | Shown) -> str:
    """A DataFrame as an HTML table, every column, each cell as the terminal table writes it."""
    df = frame.frame if isinstance(frame, Shown) else frame
    numeric = {c for c in df.columns if pd.api.types.is_numeric_dtype(df[c])}
    head = "".join(f"<th>{esc(c)}</th>" for c in df.columns)
    body = []
    for row in df.itertuples(index=False):
        cells = "".join(
            f"<td{NUM_CLASS if c in numeric else ''}>{esc(format_cell(v, str(c)))}</td>"
            for v, c in zip(row, df.columns, strict=True)
        )
        body.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def tables_html(tables: Iterable[tuple[str, pd.DataFrame | Shown]]) -> list[str]:
    """One section per titled table."""
    return [f"<h2>{esc(title)}</h2>{table_html(df)}" for title, df in tables]


def notes_html(notes: Iterable[str]) -> list[str]:
    """The notes as a list under its heading; nothing without notes."""
    items = "".join(f'<li class="note">{esc(n)}</li>' for n in notes)
    return [f"<h2>Notes</h2><ul>{items}</ul>"] if items else []


def document(title: str, sections: Iterable[str]) -> str:
    """A whole HTML document: `sections` (HTML) in order under the page's title."""
    head = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{esc(CONTENT_POLICY)}">',
        f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>",
    ]
    return "\n".join([*head, *sections, "</body></html>"]) + "\n"


def write_page(text: str, path: str | Path) -> Path:
    """Write a document to `path`, replacing what is there only once it is complete."""
    path = Path(path)
    with replaced_when_complete(path) as partial:
        partial.write_text(text, encoding="utf-8")
    return path
