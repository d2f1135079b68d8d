"""The recording-cost note of a run's summary, from seeded step times: a cost only from at least 3 steady recorded
and 3 steady unrecorded steps, as the difference of medians with its spread; `within noise` when the spread covers
it; never negative and never from single steps: otherwise no cost line at all."""

from __future__ import annotations

import random
import re

import pytest

from profiler_kit.recording.cost import MIN_STEADY
from profiler_kit.recording.runner import ParentWindow

CAPTURE = "profiler_kit.capture"


def _window(*sides: tuple[bool, list[float]]) -> ParentWindow:
    """A window whose steps ran in the order given: blocks of (recorded, step times in ms), numbered from 0."""
    steps = [(recorded, ms) for recorded, block in sides for ms in block]
    return ParentWindow(CAPTURE, steps=sum(on for on, _ in steps),
                  step_ms=tuple((number, ms, on) for number, (on, ms) in enumerate(steps)))


def _cost_lines(window: ParentWindow) -> list[str]:
    return [line for line in window.summary_notes() if line.startswith("recording cost")]


def test_a_real_cost_is_the_difference_of_medians_with_the_wider_sides_range():
    window = _window((False, [900.0, 10.0, 10.1, 10.2, 9.9]), (True, [12.0, 12.1, 11.9]))
    [line] = _cost_lines(window)
    # Medians 12.0 against 10.05 (the first step left out): +19.4%; ranges 0.2 and 0.3: ±3.0% of 10.05 ms.
    assert line.startswith("recording cost: +19.4% ± 3.0% of a step (median 12.00 ms over 3 recorded steps "
                           "against 10.05 ms over 4 unrecorded; a side's steps spread over up to 0.30 ms"), line


def test_a_difference_inside_the_spread_is_within_noise_and_shows_no_sign():
    window = _window((False, [500.0, 10.1, 9.9, 10.3]), (True, [10.0, 10.4, 9.8]))
    [line] = _cost_lines(window)
    assert line.startswith("recording cost: within noise (median 10.00 ms over 3 recorded steps against 10.10 ms "
                           "over 3 unrecorded"), line
    assert "%" not in line and "−" not in line and " -" not in line


def test_unrecorded_steps_slower_beyond_the_noise_give_no_cost_line():
    # 4 unrecorded steps (the first left out) slower than 3 recorded ones: recording cannot have sped them up.
    window = _window((False, [900.0, 70.0, 72.0, 71.0]), (True, [50.0, 51.0, 52.0]))
    assert _cost_lines(window) == []
    assert window.summary_notes()[0] == "recorded the steps profiler_kit.capture marks, 3 steps"


@pytest.mark.parametrize("sides", [
    ((False, [104.5, 62.8]), (True, [104.5])),  # one step against one
    ((False, [900.0, 10.0, 10.1]), (True, [12.0, 12.1, 11.9])),  # 2 unrecorded once the first step is left out
    ((False, [900.0, 10.0, 10.1, 10.2]), (True, [12.0, 12.1])),  # 2 recorded
    ((True, [12.0, 12.1, 11.9, 12.2]),),  # the whole run recorded
])
def test_too_few_steps_on_a_side_give_no_cost_line(sides):
    assert _cost_lines(_window(*sides)) == []


def test_warm_up_and_one_off_steps_are_left_out_of_each_side():
    # Unrecorded: warm-up (200, 150) before the window, then 10.0, 10.1, a one-off 45 (over 3× the median), 10.0.
    # Counted, the one-off would widen the unrecorded range to 35 ms and hide the cost in it.
    window = _window((False, [900.0, 200.0, 150.0]), (True, [10.5, 10.6, 10.4]), (False, [10.0, 10.1, 45.0, 10.0]))
    [line] = _cost_lines(window)
    assert line.startswith("recording cost: +5.0% ± 2.0% of a step (median 10.50 ms over 3 recorded steps against "
                           "10.00 ms over 3 unrecorded; a side's steps spread over up to 0.20 ms"), line


def test_a_recorded_warm_up_step_is_left_out_and_can_leave_too_few():
    # The window opened while the program still compiled: its first recorded step is warm-up, 2 steady remain.
    window = _window((False, [900.0, 10.0, 10.1, 10.2]), (True, [80.0, 12.0, 12.1]))
    assert _cost_lines(window) == []


@pytest.mark.parametrize("seed", range(200))
def test_seeded_runs_never_give_a_negative_or_thin_cost(seed):
    """Random programs: warm-up, a window anywhere, noise of any size, a true cost between −30% and +60%."""
    rng = random.Random(seed)
    base, noise = rng.uniform(1, 100), rng.uniform(0, 0.3)
    cost = rng.uniform(-0.3, 0.6)
    steps = rng.randint(2, 14)
    opens, closes = sorted(rng.sample(range(steps + 1), 2))

    def step(number: int, on: bool) -> float:
        ms = base * (1 + rng.uniform(-noise, noise)) * (1 + cost if on else 1)
        return ms * rng.uniform(2, 20) if number < rng.randint(0, 3) or rng.random() < 0.05 else ms

    window = _window((False, [step(n, False) for n in range(opens)]),
                     (True, [step(n, True) for n in range(opens, closes)]),
                     (False, [step(n, False) for n in range(closes, steps)]))
    for line in _cost_lines(window):
        counts = [int(n) for n in re.findall(r"over (\d+) (?:un)?recorded", line)]
        assert len(counts) == 2 and min(counts) >= MIN_STEADY, line
        assert "within noise" in line or re.match(r"recording cost: \+\d+\.\d% ± \d+\.\d% of a step", line), line
        assert not re.search(r"[-−]\d", line), line


PROGRAM = """
import time, torch, profiler_kit
cap = profiler_kit.capture(warmup=4, steps=3)
x = torch.ones(8, 8)
with cap:
    for i in range(11):
        with cap.step():
            x = (x @ x).clamp(max=1.0)
            time.sleep(0.02 if 4 <= i < 7 else 0.06)
"""


def test_a_recorded_program_whose_unrecorded_steps_are_slower_gets_no_cost_line(tmp_path):
    """The whole path: the program's step clock, its window file, the run's notes. Its unrecorded steps sleep 60 ms
    and the recorded ones 20 ms: recording did not make it faster, so no cost is said."""
    import json
    import sys

    from click.testing import CliRunner

    from profiler_kit.cli import main

    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    result = CliRunner().invoke(main, ["nsys", "--backend", "torch", "-o", str(tmp_path / "p"), "--format", "json",
                                       "--", sys.executable, str(script)])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["steps"], result.stdout
    assert "recorded the steps profiler_kit.capture marks, 3 steps" in result.stderr
    assert "recording cost" not in result.stderr, result.stderr
