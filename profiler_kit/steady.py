"""The rules the step tables, `compare` and the recording cost share: which steps of a run are warm-up or one-off
rather than its steady state, and whether two sets of steps (or runs) differ beyond their own noise.

- Warm-up: the program's first step always (it holds the program's start-up: CUDA context, allocator, library
  handles, `torch.compile`), then the leading steps after it whose time is more than WARMUP_FACTOR times the
  median of the later half. Deciding the first step by rule rather than by its time keeps two runs of one program
  in agreement: its start-up often costs about WARMUP_FACTOR times a step, where a threshold would flip with the
  noise. Where the steps are not known to start with the program's first (a report numbered from its first
  recorded step), only the threshold counts.
- One-off: a later step ONE_OFF_FACTOR times the steady median or slower (a recompilation, a pause for garbage
  collection, an evaluation) is no part of the steady state.
- Noise: each side's noise is the range of its values (largest − smallest); a difference of the sides' medians is
  real when it is larger than both sides' noise and than a floor. The range is used rather than a standard
  deviation because sides hold few values (often 3 to 5), where a standard deviation is itself noisy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

    Values = float | np.ndarray | pd.Series

# A leading step slower than this many times the later steps' median is warm-up.
WARMUP_FACTOR = 1.5
# A step this many times the steady median or slower is a one-off.
ONE_OFF_FACTOR = 3.0
WARMUP, STEADY, ONE_OFF = "warm-up", "steady", "one-off"
# The rules in a sentence, for the notes that leave steps out.
WARMUP_RULE = f"warm-up: the program's first step and the leading steps over {WARMUP_FACTOR:g}× the later half's median"
ONE_OFF_RULE = f"one-off: a later step ≥ {ONE_OFF_FACTOR:g}× the steady median"


def warmup_steps(walls: np.ndarray, first: bool = False) -> int:
    """How many leading steps (walls in run order) are warm-up: the first one when `first` (it is the program's
    first step), then those slower than WARMUP_FACTOR times the median of the later half."""
    walls = np.asarray(walls, dtype=float)
    if not len(walls):
        return 0
    reference = float(np.median(walls[len(walls) // 2:]))
    slow = walls > WARMUP_FACTOR * reference
    slow[0] |= first
    return len(walls) if slow.all() else int(np.argmin(slow))


def step_states(walls: np.ndarray, first: bool = False) -> np.ndarray:
    """WARMUP, STEADY or ONE_OFF for each step (walls in run order; `first`: the first is the program's first
    step): the leading warm-up steps (`warmup_steps`), then the one-offs among the rest (ONE_OFF_FACTOR times
    their median or slower)."""
    walls = np.asarray(walls, dtype=float)
    states = np.full(len(walls), STEADY, dtype=object)
    warm = warmup_steps(walls, first)
    states[:warm] = WARMUP
    rest = walls[warm:]
    if len(rest) and np.median(rest) > 0:
        states[warm:][rest >= ONE_OFF_FACTOR * float(np.median(rest))] = ONE_OFF
    return states


def beyond_noise(delta: Values, noise_a: Values, noise_b: Values, floor: float = 0.0) -> Values:
    """Whether each difference of medians is real: larger than both sides' noise (their ranges) and the floor
    (numbers or arrays alike)."""
    size = np.abs(delta)
    return (size > np.maximum(noise_a, noise_b)) & (size > floor)
