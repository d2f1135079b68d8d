"""Which rows of a long per-rank (or per-node) table a person reads: the slowest, the fastest and the outliers.

An outlier is a row whose value lies more than Z_LIMIT robust z-scores from the median: z = 0.6745 × (x −
median) / MAD, with MAD the median absolute deviation (Iglewicz and Hoaglin's modified z-score); where more than
half the rows share the median (MAD 0), the mean absolute deviation stands in (z = (x − median) / (1.2533 ×
mean absolute deviation)); where every row is the same, none is an outlier. A table of up to SHOW_ALL rows is
shown whole.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

Z_LIMIT = 3.5
# The slowest and the fastest rows shown, each; the outliers shown beyond them, the farthest first.
EACH_END = 5
MORE_OUTLIERS = 10
SHOW_ALL = 16
_MAD_SCALE = 0.6745
_MEAN_AD_SCALE = 1.2533


def robust_z(values: np.ndarray) -> np.ndarray:
    """Each value's robust z-score (NaN stays NaN; 0 everywhere when the values do not vary)."""
    values = np.asarray(values, dtype=float)
    known = values[~np.isnan(values)]
    if not len(known):
        return np.full(len(values), np.nan)
    median = np.median(known)
    mad = np.median(np.abs(known - median))
    if mad > 0:
        return _MAD_SCALE * (values - median) / mad
    mean_ad = np.mean(np.abs(known - median))
    if mean_ad > 0:
        return (values - median) / (_MEAN_AD_SCALE * mean_ad)
    return np.where(np.isnan(values), np.nan, 0.0)


@dataclass(frozen=True)
class Picked:
    """The rows shown (positions, the largest value first), how many of them are outliers beyond the slowest and
    the fastest, and how many rows are left out."""

    rows: np.ndarray
    further: int
    left_out: int

    def said(self, what: str) -> str:
        """The rows shown, in words (`what`: the rows' noun, plural), for a title."""
        if not self.left_out:
            return ""
        further = f" and {self.further} further outlier{'s' * (self.further != 1)}" if self.further else ""
        return (f"the {EACH_END} slowest, the {EACH_END} fastest{further} (robust z-score above {Z_LIMIT:g}); "
                f"{self.left_out:,} other {what} not shown (--wide shows every one)")


def pick(values: np.ndarray) -> Picked:
    """The rows of a table to show by `values` (larger: slower): all up to SHOW_ALL rows, else the EACH_END
    largest and smallest and up to MORE_OUTLIERS outliers between them, the farthest first; NaN rows last."""
    values = np.asarray(values, dtype=float)
    if len(values) <= SHOW_ALL:
        return Picked(np.arange(len(values)), 0, 0)
    order = np.argsort(np.where(np.isnan(values), -np.inf, values), kind="stable")[::-1]
    ends = np.r_[order[:EACH_END], order[-EACH_END:]]
    z = robust_z(values)
    far = np.flatnonzero(np.abs(np.nan_to_num(z)) > Z_LIMIT)
    far = far[~np.isin(far, ends)]
    far = far[np.argsort(-np.abs(z[far]), kind="stable")][:MORE_OUTLIERS]
    shown = np.r_[ends, far]
    rows = shown[np.argsort(np.where(np.isnan(values[shown]), -np.inf, -values[shown]), kind="stable")]
    return Picked(rows, len(far), len(values) - len(rows))
