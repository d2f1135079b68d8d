"""The HTML reports drawn from the committed example reports, opened in a real browser (Debian's chromium,
headless, driven over the DevTools protocol on a pipe): each page renders its tables and charts as the report
has them, makes no network request (nor any request but the page itself), and logs no error or script
exception. A page that does load something and throws is caught by the same check."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from profiler_kit.cli import main
from profiler_kit.kernels import compare, summarize
from profiler_kit.kernels.ranks import rank_traces, summarize_ranks
from profiler_kit.memory import analyze_file
from profiler_kit.render import Shown

REPO = Path(__file__).resolve().parents[1]
KERNELS = REPO / "tests" / "fixtures" / "kernels"
EXAMPLE = REPO / "profiles" / "examples" / "small_ctx128_train_bf16.sqlite"
MLP = KERNELS / "h100_example_mlp.sqlite"
RANKS = [KERNELS / "cpu_ddp2_gloo.rank0.json.gz", KERNELS / "cpu_ddp2_gloo.rank1.json.gz"]
FP32, BF16 = KERNELS / "h100_tiny_train_fp32.sqlite", KERNELS / "h100_tiny_train_bf16.sqlite"
SNAPSHOT = REPO / "memory_snapshots" / "examples" / "plain_adamw_fused.pickle"
CHROMIUM = shutil.which("chromium")
# Flags that run chromium as root in a container, with none of its own background traffic.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--remote-debugging-pipe"]
TIMEOUT_S = 60
# What the page holds once rendered: every table's cells, every chart's bars, the size the browser gives them.
PROBE = """JSON.stringify({
  tables: [...document.querySelectorAll('table')].map(t => [...t.rows].map(r => [...r.cells].map(c => c.textContent))),
  charts: [...document.querySelectorAll('svg.chart')].map(s => ({title: s.dataset.title,
      width: s.getBoundingClientRect().width, height: s.getBoundingClientRect().height,
      bars: [...s.querySelectorAll('rect.bar')].map(b => [b.dataset.group, b.dataset.bar, b.dataset.segment,
                                                         Number(b.dataset.ms), b.getBBox().height])})),
  svgs: document.querySelectorAll('svg').length,
  polygons: document.querySelectorAll('svg polygon').length,
})"""

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium: `make test` installs Debian's with "
                                                          "apt-get (apt-get install chromium)")


class Browser:
    """Headless chromium over the DevTools protocol on fds 3 (commands in) and 4 (replies and events out)."""

    def __init__(self) -> None:
        self.profile = tempfile.mkdtemp(prefix="pk-chromium-")
        to_browser, self._write = os.pipe()
        self._read, from_browser = os.pipe()

        def pipes() -> None:  # in the child: the protocol's fds; dup2 leaves them open across exec
            os.dup2(to_browser, 3)
            os.dup2(from_browser, 4)

        self.proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, preexec_fn=pipes, close_fds=False)
        os.close(to_browser)
        os.close(from_browser)
        self._buffer, self._next_id, self.events = b"", 0, []

    def _message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._read], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError("chromium did not answer")
            chunk = os.read(self._read, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed its pipe")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            reply = self._message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def wait_for(self, method: str) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while not any(e.get("method") == method for e in self.events):
            self.events.append(self._message(deadline))

    def open(self, page: Path) -> dict:
        """Load `page` in a new tab; what it renders (PROBE), the URLs it requested and the errors it logged."""
        self.events = []
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Network", "Runtime", "Log"):
            self.send(f"{domain}.enable", session=session)
        url = page.resolve().as_uri()
        self.send("Page.navigate", {"url": url}, session=session)
        self.wait_for("Page.loadEventFired")
        probe = self.send("Runtime.evaluate", {"expression": PROBE, "returnByValue": True}, session=session)
        self.send("Target.closeTarget", {"targetId": target})
        events = [e for e in self.events if e.get("sessionId") == session]
        requests = [e["params"]["request"]["url"] for e in events if e.get("method") == "Network.requestWillBeSent"]
        urls = {e["params"]["requestId"]: e["params"]["request"]["url"] for e in events
                if e.get("method") == "Network.requestWillBeSent"}
        blocked = [urls.get(e["params"]["requestId"]) for e in events if e.get("method") == "Network.loadingFailed"
                   and e["params"].get("blockedReason") == "csp"]
        errors = [f"{d.get('text', '')} {d.get('exception', {}).get('description', '')}"
                  for d in (e["params"]["exceptionDetails"] for e in events
                            if e.get("method") == "Runtime.exceptionThrown")]
        errors += [e["params"]["entry"]["text"] for e in events
                   if e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] in ("error", "warning")]
        errors += [" ".join(str(a.get("value", "")) for a in e["params"]["args"]) for e in events
                   if e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "warning")]
        rendered = json.loads(probe["result"]["value"])
        return {"url": url, "requests": requests, "blocked": blocked, "errors": errors, **rendered}

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._write)
        os.close(self._read)
        shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture(scope="module")
def browser():
    chromium = Browser()
    yield chromium
    chromium.close()


def written(tmp_path: Path, *args: object) -> Path:
    out = tmp_path / "page.html"
    result = CliRunner().invoke(main, [*map(str, args), "--html", str(out)])
    assert result.exit_code == 0, result.output
    return out


def assert_clean(seen: dict) -> None:
    assert seen["requests"] == [seen["url"]], seen["requests"]
    assert seen["errors"] == []


def assert_tables(seen: dict, report) -> None:
    tables = report.tables()
    assert len(seen["tables"]) == len(tables)
    for rows, (_, table) in zip(seen["tables"], tables, strict=True):
        df = table.frame[list(table.default)] if isinstance(table, Shown) else table  # the columns shown by default
        assert rows[0] == [str(c) for c in df.columns] and len(rows) == len(df) + 1


def assert_charts(seen: dict, count: int) -> None:
    assert len(seen["charts"]) == count
    for chart in seen["charts"]:
        assert chart["width"] > 0 and chart["height"] > 0 and chart["bars"]
        tallest = max(chart["bars"], key=lambda bar: bar[3])
        assert tallest[4] > 50  # the tallest bar is drawn, many pixels high
        # Bar heights on screen are proportional to their values.
        scale = tallest[4] / tallest[3]
        for *_, value, height in chart["bars"]:
            assert height == pytest.approx(value * scale, abs=0.2)


def test_summary_pages_render_their_charts_and_tables_offline(browser, tmp_path):
    for path, charts in ((EXAMPLE, 1), (MLP, 2)):
        seen = browser.open(written(tmp_path, "kernels", "summarize", path, "-f"))
        assert_clean(seen)
        summary = summarize(path)
        assert_tables(seen, summary)
        assert_charts(seen, charts)
        phases = seen["charts"][0]
        for phase, figures in summary.phase_ns().items():
            drawn = {s: ms for g, _, s, ms, _ in phases["bars"] if g == phase and ms}
            assert drawn == pytest.approx({c: ns / 1e6 for c, ns in figures["categories"].items() if ns}, rel=1e-12)


def test_rank_and_compare_pages_render_offline(browser, tmp_path):
    seen = browser.open(written(tmp_path, "kernels", "summarize", *RANKS, "-f"))
    assert_clean(seen)
    assert_tables(seen, summarize_ranks(rank_traces(RANKS)))
    assert_charts(seen, 2)
    assert {g for g, *_ in seen["charts"][0]["bars"]} == {"rank 0", "rank 1"}
    seen = browser.open(written(tmp_path, "kernels", "compare", FP32, BF16, "-f"))
    assert_clean(seen)
    assert_tables(seen, compare(summarize(FP32), summarize(BF16)))
    assert_charts(seen, 2)
    assert {b for _, b, *_ in seen["charts"][0]["bars"]} == {"A", "B"}


def test_memory_page_renders_offline(browser, tmp_path):
    seen = browser.open(written(tmp_path, "memory", "summarize", SNAPSHOT, "-f"))
    assert_clean(seen)
    assert_tables(seen, analyze_file(SNAPSHOT))
    assert seen["svgs"] == 1 and seen["polygons"] >= 5  # the timeline, an area per role


def test_the_check_sees_requests_and_script_errors(browser, tmp_path):
    page = tmp_path / "loads.html"
    page.write_text('<!DOCTYPE html><html><body><table><tr><td>1</td></tr></table>'
                    '<img src="http://192.0.2.1/x.png"><script>undefinedFunction()</script></body></html>')
    seen = browser.open(page)
    assert "http://192.0.2.1/x.png" in seen["requests"]
    assert any("undefinedFunction" in e for e in seen["errors"])
    assert seen["tables"] == [[["1"]]]


def test_the_pages_policy_blocks_what_a_page_would_load(browser, tmp_path):
    from profiler_kit.webpage import document

    page = tmp_path / "blocked.html"
    page.write_text(document("t", ['<img src="http://192.0.2.1/x.png">', "<script>undefinedFunction()</script>"]))
    seen = browser.open(page)
    assert seen["blocked"] == ["http://192.0.2.1/x.png"]  # stopped by the policy before it left the browser
    assert any("Content Security Policy" in e for e in seen["errors"])
    assert not any("undefinedFunction" in e for e in seen["errors"])  # the inline script never ran
