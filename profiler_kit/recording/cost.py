"""What recording cost a program: its recorded steps' times against its unrecorded ones, said only when both
sides hold enough steady steps to tell.

The recorder times every step the program runs, recorded or not (`window.StepClock`). Each side (recorded,
unrecorded) keeps its steady steps: the program's first step (its start-up) is left out, then the side's leading
warm-up steps and its one-off steps (the rules of `profiler_kit.steady`). With MIN_STEADY steady steps on each
side, the difference of the sides' medians is a cost when it is beyond both sides' noise (their ranges, as
`compare` judges runs), else the sides differ `within noise`. Recording never makes a program faster: unrecorded
steps slower than the recorded ones beyond the noise mean something else changed between them (another part of
the program, the machine's load), and then no cost is said at all, as with too few steady steps.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np

from profiler_kit.steady import STEADY, beyond_noise, step_states

# Steady steps each side needs before a cost is said.
MIN_STEADY = 3


def steady_steps(times_ms: Sequence[float]) -> list[float]:
    """The steady steps of one side (times in run order, the program's first step already left out): its leading
    warm-up steps and then its one-off steps left out."""
    states = step_states(np.asarray(times_ms, dtype=float))
    return [ms for ms, state in zip(times_ms, states, strict=True) if state == STEADY]


def recording_cost(step_ms: Sequence[tuple[int, float, bool]]) -> str | None:
    """The note on what recording cost, from the `(number, ms, recorded)` of every step the program ran, in the
    order they ran: a cost with its spread, `within noise`, or None (too few steady steps on a side, or the
    unrecorded steps slower beyond the noise)."""
    recorded = steady_steps([ms for number, ms, on in step_ms if on and number > 0])
    others = steady_steps([ms for number, ms, on in step_ms if not on and number > 0])
    if len(recorded) < MIN_STEADY or len(others) < MIN_STEADY:
        return None
    with_recording, without = statistics.median(recorded), statistics.median(others)
    noise_recorded, noise_others = max(recorded) - min(recorded), max(others) - min(others)
    spread = max(noise_recorded, noise_others)
    delta = with_recording - without
    real = beyond_noise(delta, noise_recorded, noise_others)
    if (real and delta < 0) or without <= 0:
        return None
    sides = (f"median {with_recording:.2f} ms over {len(recorded)} recorded steps against {without:.2f} ms over "
             f"{len(others)} unrecorded; a side's steps spread over up to {spread:.2f} ms; the program's first "
             "step, warm-up and one-off steps left out")
    if not real:
        return f"recording cost: within noise ({sides})"
    return f"recording cost: +{100 * delta / without:.1f}% ± {100 * spread / without:.1f}% of a step ({sides})"
