"""The phase rule on traces recorded from small training loops written here (torch.profiler on the CPU):
marked phases, the program's own ranges at top level, inside a `step` or beside the built-in names, the
recorder's automatic marks last, PyTorch's own ranges never phases, the note about a large range left out
(never proposing PyTorch's or the recorder's ranges), optimizer work counted as optimizer whatever its
implementation, and the per-step table."""

from __future__ import annotations

import contextlib
import gzip
import json
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

import profiler_kit
from profiler_kit.kernels import load, summarize
from profiler_kit.kernels.attribution import RangeIndex
from profiler_kit.kernels.categories import categorize
from profiler_kit.kernels.trace import range_frame

OPT_STEP = "Optimizer.step#AdamW.step"


def _program(layout: str, steps: int = 2, foreach: bool = True, data: bool = False,
             slow_first_s: float = 0.0) -> Callable[[], None]:
    """A training loop of a tiny MLP with AdamW. `layout`: `top` (fwd, bwd, opt at top level), `step` (a `step`
    holding them), `names` (forward, backward, optimizer), `no-opt` (fwd, bwd; the optimizer step in no range),
    `none` (no range of its own). `data`: a range `data` with a large matmul first in each step."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))
    optimizer = torch.optim.AdamW(model.parameters(), foreach=foreach)
    x = torch.randn(8, 16)
    names = {"names": ("forward", "backward", "optimizer")}.get(layout, ("fwd", "bwd", "opt"))

    def rng(name: str, on: bool = True) -> contextlib.AbstractContextManager:
        return profiler_kit.phase(name) if on else contextlib.nullcontext()

    def one_step() -> None:
        if data:
            with record_function("data"):
                big = torch.randn(192, 192)
                for _ in range(6):
                    big = big @ big / 192
        with rng(names[0], layout != "none"):
            loss = model(x).square().mean()
        with rng(names[1], layout != "none"):
            loss.backward()
        with rng(names[2], layout not in ("none", "no-opt")):
            optimizer.step()
            optimizer.zero_grad()

    def loop() -> None:
        for i in range(steps):
            with rng("step", layout == "step"):
                if i == 0 and slow_first_s:
                    time.sleep(slow_first_s)
                one_step()

    return loop


def record(path: Path, loop: Callable[[], None], marked: list[str] | None = None) -> Path:
    """Record `loop` with torch.profiler on the CPU into a Chrome trace; `marked`: the phase list the recorder
    of `profiler-kit nsys --backend torch` writes into the trace's metadata."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        loop()
        if marked is not None:
            prof.add_metadata_json("profiler_kit", json.dumps({"phases": marked}))
    prof.export_chrome_trace(str(path))
    return path


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> Iterator[Callable[..., Path]]:
    folder = tmp_path_factory.mktemp("phase_rule")
    made: dict[str, Path] = {}

    def get(layout: str, **options) -> Path:
        key = f"{layout}-" + "-".join(f"{k}={v}" for k, v in sorted(options.items()))
        if key not in made:
            marked = options.pop("marked", None)
            made[key] = record(folder / f"{len(made)}.json", _program(layout, **options), marked)
        return made[key]

    yield get


def _events(path: Path) -> list[dict]:
    return [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]


def test_top_level_phases_hold_the_optimizers_own_ranges(traces):
    summary = summarize(traces("top"))
    assert summary.phase_rule == "program" and summary.phase_names == ["fwd", "bwd", "opt"]
    names = set(summary.index.names())
    assert {OPT_STEP, "Optimizer.zero_grad#AdamW.zero_grad"} <= names  # PyTorch's, nested in `opt`
    assert all(summary.phase_ns()[p]["total_ns"] > 0 for p in ("fwd", "bwd", "opt"))
    assert summary.steps is None  # no repeating outer range


def test_step_holding_phases(traces):
    summary = summarize(traces("step", steps=3))
    assert summary.phase_names == ["fwd", "bwd", "opt"]
    assert summary.steps is not None and summary.steps["step"].tolist() == [0, 1, 2]


def test_forward_backward_optimizer_are_three_phases(traces):
    summary = summarize(traces("names"))
    assert summary.phase_rule == "program"
    assert summary.phase_names == ["forward", "backward", "optimizer"]
    assert summary.phase_ns()["optimizer"]["total_ns"] > 0


def test_pytorchs_ranges_are_never_phases(traces):
    summary = summarize(traces("no-opt"))
    assert summary.phase_names == ["fwd", "bwd"] and summary.phase_rule == "program"
    note = next(n for n in summary.notes if n.startswith("phases: "))
    assert note == "phases: the program's own ranges (no profiler_kit.phase ranges)"
    assert not any(n.startswith("range ") and OPT_STEP in n for n in summary.notes)  # never proposed either
    alone = summarize(traces("none"))  # a plain torch.profiler trace of a program without ranges
    assert alone.phase_names == [] and alone.phase_rule == "none"
    assert alone.category_ns()["optimizer"] > 0


def test_marked_phases_win_over_the_programs_other_ranges(traces):
    path = traces("step", data=True, marked=["fwd", "bwd", "opt"])
    summary = summarize(path)
    assert summary.phase_rule == "marked" and summary.phase_names == ["fwd", "bwd", "opt"]
    # Without the marks, the same ranges follow the program rule, where `data` is a phase too.
    plain = summarize(traces("step", data=True))
    assert plain.phase_rule == "program" and plain.phase_names == ["data", "fwd", "bwd", "opt"]


def test_a_large_range_left_out_is_named_with_the_option_that_includes_it(traces):
    summary = summarize(traces("step", data=True, marked=["fwd", "bwd", "opt"]))
    note = next(n for n in summary.notes if n.startswith("range 'data'"))
    share = float(note.split(" holds ")[1].split("%")[0])
    assert "`--phase fwd --phase bwd --phase opt --phase data` includes it" in note
    with_data = summarize(traces("step", data=True, marked=["fwd", "bwd", "opt"]),
                          phases=["fwd", "bwd", "opt", "data"])
    # Every operator of `data` is outside the other phases: its phase total is what the note counted.
    assert with_data.phase_table().set_index("phase").loc["data", "share_pct"] == pytest.approx(share, abs=0.05)
    assert share > 5.0
    assert not any(n.startswith("range ") for n in with_data.notes)


@pytest.mark.parametrize("foreach", [True, False], ids=["foreach", "for-loop"])
def test_adamw_on_cpu_is_optimizer_work(traces, foreach):
    summary = summarize(traces("top", foreach=foreach))
    ops = summary.attributed
    index = summary.index
    opt_ranges = index.ranges[index.names() == OPT_STEP]
    inside = np.zeros(len(ops), dtype=bool)
    for start, end in zip(opt_ranges["start_ns"], opt_ranges["end_ns"], strict=True):
        inside |= (ops["launch_ns"] >= start).to_numpy() & (ops["launch_ns"] <= end).to_numpy()
    assert inside.any()
    assert (ops.loc[inside, "category"] == "optimizer").all()
    assert summary.category_ns()["optimizer"] == int(ops.loc[inside, "total_ns"].sum())
    by_name = categorize(ops.loc[inside, "name"], "cpu_op")
    if not foreach:  # a for-loop's operators (`aten::mul_`, `lerp_`, `addcdiv_`) say nothing of the optimizer
        assert (by_name != "optimizer").all()


def test_per_step_table_shows_warm_up(traces):
    path = traces("step", steps=4, slow_first_s=0.2)
    summary = summarize(path)
    steps = summary.steps
    # CPU operators: no GPU to idle, so no idle column.
    assert list(steps.columns) == ["step", "state", "wall_ms", "operator_ms", "fwd_ms", "bwd_ms", "opt_ms"]
    assert steps["state"].iloc[0] == "warm-up" and steps["state"].iloc[-1] == "steady"
    walls = [e["dur"] / 1000 for e in _events(path) if e["name"] == "step"]
    assert steps["wall_ms"].tolist() == pytest.approx(walls, abs=1e-3)
    for phase in ("fwd", "bwd", "opt"):
        assert steps[f"{phase}_ms"].sum() * 1e6 == pytest.approx(summary.phase_ns()[phase]["total_ns"], abs=1)
    assert (steps["operator_ms"] >= steps[["fwd_ms", "bwd_ms", "opt_ms"]].sum(axis=1) - 1e-9).all()
    assert json.loads(json.dumps(summary.to_json()["steps"]))[0]["state"] == "warm-up"
    assert any("Per step" in title for title, _ in summary.tables())


def test_cpu_tables_count_operators(traces):
    summary = summarize(traces("top"))
    assert "operators" in summary.category_table().columns and "kernels" not in summary.category_table()
    assert "operators" in summary.phase_table().columns
    titles = [title for title, _ in summary.tables()]
    assert titles[0].startswith("CPU operator self time by category")
    assert "cPU" not in " ".join(titles) + summary.caption()


# The rule on range layouts built here


def _index(names: list[str], starts: list[int], ends: list[int], threads: list[int] | None = None,
           marked: list[bool] | None = None, kinds: list[str] | None = None) -> RangeIndex:
    if marked is not None:
        kinds = ["phase" if m else "program" for m in marked]
    return RangeIndex(range_frame(names, starts, ends, [1] * len(names), threads or [1] * len(names), kinds))


# Marks as the readers see them


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernels"
MLP_EXPORT = FIXTURES / "h100_example_mlp.sqlite"  # `step` ⊃ fwd/bwd/opt, one process


def test_sqlite_ranges_in_the_profiler_kit_domain_are_marked(tmp_path):
    """The committed export with `fwd` and `bwd` moved into the `profiler_kit` NVTX domain (as the `nvtx`
    package pushes them): a domain-create row (event type 75) per process names the domain id."""
    path = tmp_path / "marked.sqlite"
    shutil.copyfile(MLP_EXPORT, path)
    con = sqlite3.connect(path)
    (tid,) = con.execute("SELECT globalTid FROM NVTX_EVENTS GROUP BY globalTid ORDER BY count(*) DESC").fetchone()
    other_process = tid + (1 << 24)
    con.executemany("INSERT INTO NVTX_EVENTS (start, eventType, text, globalTid, domainId) VALUES (0, 75, ?, ?, ?)",
                    [("profiler_kit", tid, 1), ("someone_else", tid, 2), ("profiler_kit", other_process, 2)])
    con.execute("UPDATE NVTX_EVENTS SET domainId = 1 WHERE textId IN "
                "(SELECT id FROM StringIds WHERE value IN ('fwd', 'bwd'))")
    # `opt` sits in a domain that is `profiler_kit` in another process only: not marked.
    con.execute("UPDATE NVTX_EVENTS SET domainId = 2 WHERE textId = (SELECT id FROM StringIds WHERE value = 'opt')")
    con.commit()
    con.close()
    ranges = load(path).ranges
    assert set(ranges.loc[ranges["marked"], "name"]) == {"fwd", "bwd"}
    summary = summarize(path)
    assert summary.phase_rule == "marked" and summary.phase_names == ["fwd", "bwd"]
    # `opt`'s kernels (16% of the time) are outside the phases now, and the note says how to get them back.
    note = next(n for n in summary.notes if n.startswith("range 'opt'"))
    assert "`--phase fwd --phase bwd --phase opt` includes it" in note
    assert summarize(MLP_EXPORT).phase_rule == "program"


def test_torch_trace_metadata_marks_ranges_by_name(tmp_path):
    source = json.loads(gzip.decompress((FIXTURES / "cpu_example_mlp_torch.json.gz").read_bytes()))
    source["profiler_kit"] = {"phases": ["bwd", 7]}
    path = tmp_path / "marked.json"
    path.write_text(json.dumps(source))
    ranges = load(path).ranges
    assert set(ranges.loc[ranges["marked"], "name"]) == {"bwd"}
    assert summarize(path).phase_names == ["bwd"]
    assert not load(FIXTURES / "cpu_example_mlp_torch.json.gz").ranges["marked"].any()


def test_the_rule_is_one_text_in_the_help_the_readme_and_the_docs():
    from click.testing import CliRunner

    from profiler_kit.cli import main
    from profiler_kit.names import PHASE_RULE as RULE

    repo = Path(__file__).resolve().parents[2]
    flat = " ".join(RULE.split())
    for page in (repo / "README.md", repo / "docs" / "nsys.md"):
        assert flat in " ".join(page.read_text().split()), page.name
    shown = CliRunner().invoke(main, ["kernels", "summarize", "--help"]).stdout
    assert flat in " ".join(shown.split())


def test_a_phase_counts_only_the_ranges_of_the_kind_its_rule_chose():
    """A program's own `forward` and the recorder's automatic `forward` over other work: the phase `forward` of the
    program rule holds the program's ranges only, and the marks' step holds it."""
    from profiler_kit.kernels.labels import ranges_of
    from profiler_kit.kernels.trace import KernelTrace, kernel_frame

    names = ["step", "forward", "forward", "backward"]
    ranges = range_frame(names, [0, 1, 5, 10], [20, 4, 9, 15], [1] * 4, [1] * 4, ["auto", "program", "auto", "auto"])
    trace = KernelTrace("test", Path("t"), kernel_frame([], np.zeros(0, np.int64)), ranges)
    labelled = ranges_of(trace, True)
    assert labelled.choice.rule == "program" and labelled.phases == ["forward"]
    counted = labelled.index.ranges
    assert counted[counted["name"] == "forward"][["start_ns", "kind"]].values.tolist() == [[1, "program"]]
    asked = ranges_of(trace, True, ["forward"])
    assert asked.choice.rule == "asked" and len(asked.index.ranges) == 4  # asked by name: every kind
