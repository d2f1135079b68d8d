"""The profiler's own operators are shown apart, never among the program's: in a trace of a program that
`profiler_kit.instrument` hooked (its `<module>.forward`/`.backward` ranges are there), PyTorch's
`BackwardHookFunction` operators and what they call are the profiler's overhead; in a trace without those ranges
the same operators are the program's own hooks and stay in its tables."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from profiler_kit.kernels import summarize
from profiler_kit.kernels.cpu_ops import HOOK_OPERATORS

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernels"
INSTRUMENTED = FIXTURES / "cpu_example_mlp_torch.json.gz"  # examples/train_mlp.py: instrument(model, depth=2)


def _events(path: Path) -> list[dict]:
    return json.loads(gzip.open(path).read())["traceEvents"]


def _hook_time_ns(events: list[dict]) -> tuple[int, int]:
    """The wall time of the outermost hook operators (the self times of a call and of everything it calls add up
    to its duration) and of all outermost CPU operators, in ns, by plain interval containment per thread."""
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]

    def inside(e: dict, outer: dict) -> bool:
        return (e is not outer and (e["pid"], e["tid"]) == (outer["pid"], outer["tid"])
                and outer["ts"] <= e["ts"] and e["ts"] + e["dur"] <= outer["ts"] + outer["dur"])

    hooks = [e for e in ops if HOOK_OPERATORS.match(e["name"])]
    outer_hooks = [h for h in hooks if not any(inside(h, o) for o in hooks)]
    outermost = [e for e in ops if not any(inside(e, o) for o in ops)]
    return (round(sum(h["dur"] for h in outer_hooks) * 1000), round(sum(e["dur"] for e in outermost) * 1000))


def test_instruments_hooks_are_the_profilers_overhead_and_left_out_of_every_table():
    summary = summarize(INSTRUMENTED)
    hooks_ns, all_ns = _hook_time_ns(_events(INSTRUMENTED))
    overhead = summary.overhead
    assert hooks_ns > 0 and overhead.total_ns == pytest.approx(hooks_ns, abs=50)  # µs decimals rounded per event
    assert overhead.cpu_ops_ns == pytest.approx(all_ns, abs=2_000)
    assert overhead.total_ns + summary.total_ns == overhead.cpu_ops_ns
    assert overhead.share_pct == pytest.approx(100.0 * overhead.total_ns / overhead.cpu_ops_ns)
    assert not summary.kernels["name"].str.contains("BackwardHookFunction").any()
    assert summary.phases["total_ns"].sum() == summary.total_ns  # the phases hold none of it either
    doc = summary.to_json()
    assert doc["profiler_overhead"]["total_ns"] == overhead.total_ns
    assert set(doc["profiler_overhead"]["operators"]) >= {"BackwardHookFunction", "BackwardHookFunctionBackward"}
    line = next(line for line in summary.caption().splitlines() if line.startswith("profiler overhead"))
    assert f"{overhead.total_ns / 1e6:.3f} ms" in line and f"({overhead.share_pct:.1f}% of" in line


def test_a_programs_own_hooks_stay_among_its_operators(tmp_path):
    """The same trace less instrument's ranges: the hooks are the program's."""
    events = [e for e in _events(INSTRUMENTED)
              if not (e.get("cat") == "user_annotation" and str(e.get("name")).endswith((".forward", ".backward")))]
    path = tmp_path / "own_hooks.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    summary = summarize(path)
    assert summary.overhead.total_ns == 0 and summary.to_json()["profiler_overhead"]["total_ns"] == 0
    assert summary.kernels["name"].str.contains("BackwardHookFunction").any()
    assert summary.total_ns == summary.overhead.cpu_ops_ns
    assert not any(line.startswith("profiler overhead") for line in summary.caption().splitlines())


def test_a_gpu_report_without_cpu_operators_has_no_overhead_entry():
    summary = summarize(FIXTURES / "h100_tiny_train_bf16.sqlite")
    assert summary.overhead is None and summary.to_json()["profiler_overhead"] is None
