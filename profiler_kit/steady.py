"""The rules the step tables, `compare` and the recording cost share: which steps of a run are warm-up or one-off
rather than its steady state, and whether two sets of steps (or runs) differ beyond their own noise.

- Warm-up: the first steps of a run are slower (CUDA and allocator start-up, `torch.compile`, autotuning): leading
  steps whose time is more than WARMUP_FACTOR times the median of the later half are warm-up.
- One-off: a step ONE_OFF_FACTOR times the steady median or slower (a recompilation, a pause for garbage
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


def warmup_steps(walls: np.ndarray) -> int:
    """How many leading steps (walls in run order) are warm-up: slower than WARMUP_FACTOR times the median of
    the later half."""
    reference = float(np.median(walls[len(walls) // 2:]))
    slow = walls > WARMUP_FACTOR * reference
    return len(walls) if slow.all() else int(np.argmin(slow))


def beyond_noise(delta: Values, noise_a: Values, noise_b: Values, floor: float = 0.0) -> Values:
    """Whether each difference of medians is real: larger than both sides' noise (their ranges) and the floor
    (numbers or arrays alike)."""
    size = np.abs(delta)
    return (size > np.maximum(noise_a, noise_b)) & (size > floor)
