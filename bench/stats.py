"""Statistics over timing samples grouped by process: medians, confidence intervals, comparisons.

Runs inside one process share that process's state (its heap layout, thread placement, CPU
frequency), so they are not independent draws: two processes of one row differ by more than the
runs within either. The bootstrap here is therefore hierarchical: each resample draws processes
with replacement, then runs with replacement within each drawn process, and takes the median of
the pool. scipy.stats.bootstrap resamples observations as if independent, which would give
intervals too narrow by the process-to-process spread (and false alarms in `compare`).
numpy only: the infer image and the train image both have it.
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


@dataclass(frozen=True)
class Change:
    ratio: float      # new median / base median
    ci_low: float
    ci_high: float

    def verdict(self) -> str:
        if self.ci_low > 1:
            return "slower"
        if self.ci_high < 1:
            return "faster"
        return "no significant change"


def change(base_by_process: list, new_by_process: list, confidence: float = CONFIDENCE, seed: int = 0) -> Change:
    """NEW/BASE as a ratio of medians, with an interval from independent hierarchical resamples of each."""
    base = _groups(base_by_process)
    new = _groups(new_by_process)
    ratios = bootstrap_medians(new, seed=seed + 1) / bootstrap_medians(base, seed=seed)
    low, high = np.quantile(ratios, [(1 - confidence) / 2, (1 + confidence) / 2])
    point = float(np.median(np.concatenate(new)) / np.median(np.concatenate(base)))
    return Change(point, float(low), float(high))


def overlap(a: Summary, b: Summary) -> bool:
    """The two medians' intervals overlap: the difference between them is within noise."""
    return a.ci_low <= b.ci_high and b.ci_low <= a.ci_high
