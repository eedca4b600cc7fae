"""Statistics over timing samples grouped by process: medians, confidence intervals, comparisons.

Runs inside one process share that process's state (its heap layout, thread placement, CPU
frequency), so they are not independent draws: two processes of one row differ by more than the
runs within either. The bootstrap here is therefore hierarchical: each resample draws processes
with replacement, then runs with replacement within each drawn process, and takes the median of
the pool; it gives each row's interval in the tables. scipy.stats.bootstrap resamples observations
as if independent, which would give intervals too narrow by the process-to-process spread. Two
runs are compared (`change`) with processes as the units instead: with 3 processes a side the
bootstrap's interval is too narrow for a test. numpy for the rest: the infer image and the train
image both have it; `change` takes Welch's interval from scipy, which only the compare and tests sessions install.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from infer.workloads import percentiles_ms

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
    ratio: float      # new / base: geometric mean of the process medians' ratio
    ci_low: float
    ci_high: float

    def verdict(self, threshold: float | None = None) -> str:
        """slower/faster when the interval excludes 1. An interval that holds 1 and also a slowdown of
        `threshold` (1 + t) cannot tell them apart: "inconclusive", never
        "no significant change" (pyperf and Google Benchmark's compare keep that distinction too)."""
        if self.ci_low > 1:
            return "slower"
        if self.ci_high < 1:
            return "faster"
        if threshold is not None and self.ci_high > 1 + threshold:  # a slowdown of the threshold not ruled out
            return "inconclusive"
        return "no significant change"

    @property
    def resolution(self) -> float:
        """The smallest change this comparison can tell from noise: the interval's half-width as a
        fraction (0.08: changes within about 8 % either way look like noise)."""
        return float(np.sqrt(self.ci_high / self.ci_low) - 1) if self.ci_low > 0 else float("inf")


def change(base_by_process: list, new_by_process: list) -> Change:
    """NEW/BASE with a 95% interval that treats processes as the units (Welch's t on log process medians).

    The runs inside a process are not independent draws, and a bootstrap that resamples 3 processes
    a side cannot see how far processes differ: on synthetic data with a known 2% process effect it
    called 16 of 100 same-distribution pairs significant, and on five same-build runs of this machine
    31 of 100. Each process's median is one observation; Welch's interval with its few degrees of
    freedom is as wide as so few processes warrant. Needs 2 processes a side.
    """
    from scipy import stats  # only `nox -s compare` and the tests need it: requirements/compare.txt

    base = np.log([np.median(g) for g in _groups(base_by_process)])
    new = np.log([np.median(g) for g in _groups(new_by_process)])
    if len(base) < 2 or len(new) < 2:
        raise ValueError("a change needs 2 processes a side")
    diff = float(new.mean() - base.mean())
    if base.var() == 0 and new.var() == 0:  # t is undefined; identical processes leave no doubt
        return Change(float(np.exp(diff)), float(np.exp(diff)), float(np.exp(diff)))
    low, high = stats.ttest_ind(new, base, equal_var=False).confidence_interval(CONFIDENCE)
    return Change(float(np.exp(diff)), float(np.exp(low)), float(np.exp(high)))


def overlap(a: Summary, b: Summary) -> bool:
    """The two medians' intervals overlap: the difference between them is within noise."""
    return a.ci_low <= b.ci_high and b.ci_low <= a.ci_high


def timing_figures(seconds_by_process: list[list[float]]) -> dict:
    """A row's timing columns from its processes' runs: percentiles of the pool, the median's 95% interval
    (summarise, below) and the spread between processes."""
    summary = summarise(seconds_by_process)
    return dict(percentiles_ms([s for g in seconds_by_process for s in g]), processes=summary.processes,
                ci_low_ms=round(summary.ci_low * 1e3, 4), ci_high_ms=round(summary.ci_high * 1e3, 4),
                process_spread=round(summary.process_spread, 4))
