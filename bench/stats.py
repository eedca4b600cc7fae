"""Statistics over timing samples grouped by process: medians, confidence intervals, comparisons.

Runs inside one process share that process's state (its heap layout, thread placement, CPU
frequency), so they are not independent draws: two processes of one row differ by more than the
runs within either. The bootstrap here is therefore hierarchical: each resample draws processes
with replacement, then runs with replacement within each drawn process, and takes the median of
the pool; it gives each row's interval in the tables. scipy.stats.bootstrap resamples observations
as if independent, which would give intervals too narrow by the process-to-process spread. Two
runs are compared (`change`) with processes as the units instead: with 3 processes a side the
bootstrap's interval is too narrow for a test. numpy only: the infer image and the train image
both have it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RESAMPLES = 2000
CONFIDENCE = 0.95


def _groups(samples_by_process: list) -> list[np.ndarray]:
    groups = [np.asarray(g, dtype=float) for g in samples_by_process if len(g)]
    if not groups:
        raise ValueError("no samples")
    return groups


def bootstrap_medians(samples_by_process: list, resamples: int = RESAMPLES, seed: int = 0) -> np.ndarray:
    """`resamples` medians of hierarchical resamples (processes, then runs within each)."""
    groups = _groups(samples_by_process)
    rng = np.random.default_rng(seed)
    # One matrix per resample: pad groups to the longest so that the draw is vectorised.
    width = max(len(g) for g in groups)
    table = np.full((len(groups), width), np.nan)
    for i, g in enumerate(groups):
        table[i, :len(g)] = g
    sizes = np.array([len(g) for g in groups])
    picked = rng.integers(0, len(groups), size=(resamples, len(groups)))           # processes
    runs = (rng.random((resamples, len(groups), width)) * sizes[picked][..., None]).astype(int)  # runs within each
    drawn = table[picked[..., None], runs]
    # Each drawn process contributes as many runs as it has (pad columns beyond its size are masked).
    mask = np.arange(width)[None, None, :] < sizes[picked][..., None]
    drawn = np.where(mask, drawn, np.nan)
    return np.nanmedian(drawn.reshape(resamples, -1), axis=1)


@dataclass(frozen=True)
class Summary:
    median: float           # of all runs pooled
    ci_low: float           # hierarchical bootstrap interval of the median
    ci_high: float
    processes: int
    runs: int
    process_spread: float   # (slowest - fastest process median) / median: how much a re-run can move


def summarise(samples_by_process: list, confidence: float = CONFIDENCE) -> Summary:
    groups = _groups(samples_by_process)
    pooled = np.concatenate(groups)
    median = float(np.median(pooled))
    if len(groups) == 1 and len(pooled) == 1:
        low = high = median
    else:
        low, high = np.quantile(bootstrap_medians(groups), [(1 - confidence) / 2, (1 + confidence) / 2])
    per_process = [float(np.median(g)) for g in groups]
    spread = (max(per_process) - min(per_process)) / median if median else 0.0
    return Summary(median, float(low), float(high), len(groups), len(pooled), spread)


# Student's t, two-sided 95% (the 0.975 quantile), by degrees of freedom: standard table values.
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042]


def t975(df: float) -> float:
    """The 0.975 quantile of Student's t; a fractional df is rounded down (the wider interval)."""
    whole = max(1, int(df))
    if whole <= len(_T975):
        return _T975[whole - 1]
    return 2.021 if whole < 60 else 2.000 if whole < 120 else 1.980 if whole < 1000 else 1.960


@dataclass(frozen=True)
class Change:
    ratio: float      # new / base: geometric mean of the process medians' ratio
    ci_low: float
    ci_high: float

    def verdict(self) -> str:
        if self.ci_low > 1:
            return "slower"
        if self.ci_high < 1:
            return "faster"
        return "no significant change"


def change(base_by_process: list, new_by_process: list) -> Change:
    """NEW/BASE with a 95% interval that treats processes as the units (Welch's t on log process medians).

    The runs inside a process are not independent draws, and a bootstrap that resamples 3 processes
    a side cannot see how far processes differ: on synthetic data with a known 2% process effect it
    called 16 of 100 same-distribution pairs significant, and on five same-build runs of this machine
    31 of 100. Each process's median is one observation; Welch's interval with its few degrees of
    freedom is as wide as so few processes warrant. Needs 2 processes a side.
    """
    base = np.log([np.median(g) for g in _groups(base_by_process)])
    new = np.log([np.median(g) for g in _groups(new_by_process)])
    if len(base) < 2 or len(new) < 2:
        raise ValueError("a change needs 2 processes a side")
    diff = float(new.mean() - base.mean())
    a, b = base.var(ddof=1) / len(base), new.var(ddof=1) / len(new)
    se = float(np.sqrt(a + b))
    if se == 0:
        return Change(float(np.exp(diff)), float(np.exp(diff)), float(np.exp(diff)))
    df = (a + b) ** 2 / ((a * a / (len(base) - 1) if a else 0.0) + (b * b / (len(new) - 1) if b else 0.0))
    half = t975(df) * se
    return Change(float(np.exp(diff)), float(np.exp(diff - half)), float(np.exp(diff + half)))


def overlap(a: Summary, b: Summary) -> bool:
    """The two medians' intervals overlap: the difference between them is within noise."""
    return a.ci_low <= b.ci_high and b.ci_low <= a.ci_high
