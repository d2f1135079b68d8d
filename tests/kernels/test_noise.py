"""The noise rule of a comparison, on generated runs."""

from __future__ import annotations

import numpy as np
import pytest

from profiler_kit.errors import ProfilerKitError
from profiler_kit.kernels.noise import (
    IMPROVED,
    REGRESSED,
    WITHIN,
    run_frame,
    runs_from_json,
    runs_to_json,
    verdicts,
)

BASE_NS = {"kernel:gemm": 6_000_000, "kernel:softmax": 1_000_000, "kernel:add": 2_000_000,
           "kernel:adam": 1_000_000}


def generated(runs: int, seed: int, jitter: float, slower: dict[str, float] | None = None) -> list[dict[str, int]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(runs):
        run = {q: int(ns * (slower or {}).get(q, 1.0) * (1 + rng.uniform(-jitter, jitter)))
               for q, ns in BASE_NS.items()}
        run["total"] = sum(run.values())
        out.append(run)
    return out


def test_one_percent_jitter_on_both_sides_is_within_noise():
    table = verdicts(run_frame(generated(5, 1, 0.01)), run_frame(generated(5, 2, 0.01)), min_delta_ns=0,
                     fail_above_pct=1.0)
    assert set(table["verdict"]) == {WITHIN}
    assert not table["failed"].any()


def test_a_ten_percent_slower_kernel_fails_and_is_named():
    a = run_frame(generated(5, 1, 0.01))
    b = run_frame(generated(5, 2, 0.01, slower={"kernel:softmax": 1.10}))
    table = verdicts(a, b, min_delta_ns=0, fail_above_pct=5.0).set_index("quantity")
    assert table.loc["kernel:softmax", "verdict"] == REGRESSED
    assert table.loc[table["failed"]].index.tolist() == ["kernel:softmax"]
    assert table.loc["kernel:softmax", "delta_pct"] == pytest.approx(10.0, abs=2.5)
    # The total grew by about 1%: outside its noise (the kernels' jitter averages out), below the gate's 5%.
    assert table.loc["total", "verdict"] == REGRESSED and not table.loc["total", "failed"]


def test_the_floor_and_single_runs():
    a, b = run_frame([{"total": 1_000_000}]), run_frame([{"total": 1_100_000}])
    # One run a side: no noise estimate, the floor alone decides.
    assert verdicts(a, b, min_delta_ns=50_000)["verdict"].item() == REGRESSED
    assert verdicts(a, b, min_delta_ns=200_000)["verdict"].item() == WITHIN
    assert verdicts(b, a, min_delta_ns=50_000)["verdict"].item() == IMPROVED
    # A quantity only B has is new time: a regression from zero fails any gate.
    table = verdicts(a, run_frame([{"total": 1_000_000, "kernel:new": 300_000}]), 0, fail_above_pct=50)
    assert table.set_index("quantity").loc["kernel:new", ["verdict", "failed"]].tolist() == [REGRESSED, True]


def test_runs_round_trip_through_json_and_bad_json_is_refused():
    runs = generated(3, 7, 0.01)
    assert runs_to_json(runs_from_json(runs, "x.json")) == runs
    for bad in ([], [{"total": -1}], [{"total": 1.5}], [["total", 1]], {"total": 1}, [{"total": True}]):
        with pytest.raises(ProfilerKitError, match="x.json"):
            runs_from_json(bad, "x.json")
