"""Summary statistics shared by derivation, `bench workloads show` and fidelity checks (numpy only)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

PERCENTILES = (1, 10, 25, 50, 75, 90, 99)


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """p1..p99, min, max, mean with numpy's default linear interpolation (what summary.json uses)."""
    array = np.asarray(values, dtype=np.float64)
    if array.size == 0:
        raise ValueError("percentiles of an empty list")
    result = {f"p{q}": round(float(np.percentile(array, q)), 2) for q in PERCENTILES}
    result.update(min=float(array.min()), max=float(array.max()), mean=round(float(array.mean()), 2))
    return result


def coefficient_of_variation(values: Sequence[float]) -> float:
    array = np.asarray(values, dtype=np.float64)
    mean = array.mean() if array.size else 0.0
    return float(array.std() / mean) if mean > 0 else float("nan")


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks with ties averaged (as Spearman's rho needs)."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    first_rank = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return (first_rank + (counts - 1) / 2.0)[inverse]


def correlation(inputs: Sequence[int], outputs: Sequence[int]) -> dict[str, float]:
    """Pearson, Spearman and Pearson on log1p; nan when a column is constant."""
    x, y = np.asarray(inputs, dtype=np.float64), np.asarray(outputs, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            "pearson": round(float(np.corrcoef(x, y)[0, 1]), 4),
            "spearman": round(float(np.corrcoef(_ranks(x), _ranks(y))[0, 1]), 4),
            "pearson_log1p": round(float(np.corrcoef(np.log1p(x), np.log1p(y))[0, 1]), 4),
        }


def window_counts(timestamps: Sequence[float], window_s: float) -> np.ndarray:
    times = np.asarray(timestamps, dtype=np.float64)
    bins = np.floor((times - times[0]) / window_s).astype(np.int64)
    return np.bincount(bins)


def arrival_stats(timestamps: Sequence[float], windows_s: Sequence[float] = (1, 10, 60)) -> dict:
    """Mean rate, inter-arrival CV and percentiles, and per-window count dispersion."""
    times = np.asarray(timestamps, dtype=np.float64)
    gaps = np.diff(times)
    span = float(times[-1] - times[0])
    stats: dict = {
        "n_requests": int(times.size),
        "span_s": round(span, 3),
        "mean_rate_rps": round((times.size - 1) / span, 4) if span > 0 else float("inf"),
        "iat_cv": round(coefficient_of_variation(gaps), 4),
        "iat_zero_fraction": round(float(np.mean(gaps == 0)), 4),
        "iat_percentiles_s": {f"p{q}": round(float(np.percentile(gaps, q)), 4) for q in (50, 90, 99)},
    }
    for window in windows_s:
        counts = window_counts(times, window).astype(np.float64)
        mean = counts.mean()
        stats[f"window_{window:g}s"] = {
            "mean_count": round(float(mean), 4),
            "cv": round(float(counts.std() / mean), 4),
            "index_of_dispersion": round(float(counts.var() / mean), 4),
            "peak_to_mean": round(float(counts.max() / mean), 3),
        }
    return stats


def prefix_reuse(prefix_ids: Sequence[Sequence[int]], input_lens: Sequence[int], block_size: int) -> dict:
    """Infinite-cache prefix reuse in trace order: a block is reused while every block before it was seen."""
    seen: set[int] = set()
    total_blocks = reused_blocks = reused_tokens = total_tokens = with_hit = with_two = 0
    for ids, input_len in zip(prefix_ids, input_lens, strict=True):
        cached = 0
        while cached < len(ids) and ids[cached] in seen:
            cached += 1
        seen.update(ids)
        total_blocks += len(ids)
        reused_blocks += cached
        reused_tokens += min(cached * block_size, input_len)
        total_tokens += input_len
        with_hit += cached >= 1
        with_two += cached >= 2
    n = max(len(input_lens), 1)
    return {
        "block_size_tokens": block_size,
        "total_blocks": total_blocks,
        "unique_blocks": len(seen),
        "block_reuse_ratio_longest_cached_prefix": round(reused_blocks / max(total_blocks, 1), 4),
        "token_reuse_ratio_longest_cached_prefix": round(reused_tokens / max(total_tokens, 1), 4),
        "fraction_requests_with_prefix_hit": round(with_hit / n, 4),
        "fraction_requests_with_prefix_hit_ge2_blocks": round(with_two / n, 4),
    }


def ks_statistic(sample_a: Sequence[float], sample_b: Sequence[float]) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the two empirical CDFs."""
    a = np.sort(np.asarray(sample_a, dtype=np.float64))
    b = np.sort(np.asarray(sample_b, dtype=np.float64))
    if a.size == 0 or b.size == 0:
        raise ValueError("KS statistic needs two non-empty samples")
    grid = np.concatenate([a, b])
    cdf_a = np.searchsorted(a, grid, side="right") / a.size
    cdf_b = np.searchsorted(b, grid, side="right") / b.size
    return float(np.max(np.abs(cdf_a - cdf_b)))
