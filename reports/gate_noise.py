"""Between-run noise for `bench gate`: the hierarchical bootstrap over repeats, the noise floor for a side
measured once, the floor measured from a baseline store's blessed history, and the machine-speed check.

Two levels of noise move a latency statistic between runs of identical code: request-to-request noise
within a run, and drift between runs (CPU frequency, cache state, neighbours, the order of points). A
bootstrap over requests sees only the first. With repeats (`bench sweep --repeats R`), resampling repeats
with replacement and then requests within each chosen repeat puts both in the interval. A side measured
once has no between-run spread to resample: its bootstrap statistic is multiplied by exp(sigma * Z),
Z ~ N(0, 1), where sigma is the noise floor (the relative standard deviation of the statistic between runs).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

MAX_BOOTSTRAP_ELEMENTS = 20_000_000  # per batch, bounds memory for long pooled-ITL samples
HISTORY_STATS = ("mean", "median", "p90", "p95", "p99")  # recorded per point and latency metric at blessing
MIN_HISTORY_RUNS = 3


def statistic(samples: np.ndarray, stat: str | float) -> np.ndarray:
    """Mean or percentile along the last axis, ignoring NaN padding (the percentile is numpy's 'linear' one)."""
    if stat == "mean":
        return np.nanmean(samples, axis=-1)
    return nan_percentile(samples, float(stat))


def nan_percentile(samples: np.ndarray, q: float) -> np.ndarray:
    """np.nanpercentile(samples, q, axis=-1), vectorised over the rows. numpy falls back to one Python-level
    call per row when any NaN is present, which made a bootstrap of padded repeats thousands of times slower."""
    ordered = np.sort(samples, axis=-1)  # NaN sorts last
    count = np.count_nonzero(~np.isnan(ordered), axis=-1)
    position = q / 100.0 * np.maximum(count - 1, 0)
    low = np.floor(position).astype(int)
    high = np.minimum(low + 1, np.maximum(count - 1, 0))
    a = np.take_along_axis(ordered, low[..., None], axis=-1)[..., 0]
    b = np.take_along_axis(ordered, high[..., None], axis=-1)[..., 0]
    t = position - low
    diff = b - a
    # numpy's lerp: exact at both ends.
    value = np.where(t >= 0.5, b - diff * (1 - t), a + diff * t)
    return np.where(count > 0, value, np.nan)


def hierarchical_bootstrap(
    groups: list[np.ndarray], stat: str | float, n_boot: int, rng: np.random.Generator
) -> np.ndarray:
    """Bootstrap distribution of the pooled statistic: pick len(groups) repeats with replacement, then resample
    each chosen repeat's requests with replacement (one group: the plain bootstrap over requests). With R > 1
    repeats the log-deviations from the observed statistic are stretched by sqrt(R / (R - 1)), the usual
    small-sample correction, which brings the coverage to the nominal level for R >= 3 (tests/reports)."""
    sizes = np.array([g.size for g in groups])
    padded = np.full((len(groups), sizes.max()), np.nan)
    for i, group in enumerate(groups):
        padded[i, : group.size] = group
    width = len(groups) * sizes.max()
    batch = max(1, MAX_BOOTSTRAP_ELEMENTS // width)
    out = np.empty(n_boot)
    for start in range(0, n_boot, batch):
        stop = min(n_boot, start + batch)
        if len(groups) == 1:
            chosen = np.zeros((stop - start, 1), dtype=int)
        else:
            chosen = rng.integers(0, len(groups), size=(stop - start, len(groups)))
        chosen_sizes = sizes[chosen][..., None]
        picks = (rng.random((stop - start, len(groups), sizes.max())) * chosen_sizes).astype(int)
        values = padded[chosen[..., None], picks]
        values[np.arange(sizes.max()) >= chosen_sizes] = np.nan  # a smaller repeat contributes only its size
        out[start:stop] = statistic(values.reshape(stop - start, -1), stat)
    observed = float(statistic(np.concatenate(groups), stat))
    if len(groups) > 1 and observed > 0 and (out > 0).all():
        # Resampling R repeats shrinks the between-run variance by (R - 1) / R; stretch the log-deviations back.
        out = observed * np.exp(np.log(out / observed) * math.sqrt(len(groups) / (len(groups) - 1)))
    return out


def widen(boot: np.ndarray, noise_floor: float, rng: np.random.Generator) -> np.ndarray:
    """A single run's bootstrap statistics with between-run noise of relative SD `noise_floor` added."""
    return boot * np.exp(noise_floor * rng.standard_normal(boot.size))


def point_stats(latencies_ms: dict[str, np.ndarray]) -> dict[str, float]:
    """`{"tpot_p90": ...}` for every latency metric and HISTORY_STATS statistic of one point."""
    out = {}
    for name, values in latencies_ms.items():
        values = values[~np.isnan(values)]
        if not values.size:
            continue
        for stat in HISTORY_STATS:
            q: str | float = "mean" if stat == "mean" else 50.0 if stat == "median" else float(stat[1:])
            out[f"{name}_{stat}"] = float(statistic(values, q))
    return out


def history_noise_floor(
    store: Path, point: str, metric: str, same_workload: Callable[[dict[str, Any]], bool]
) -> tuple[float, int] | None:
    """(relative SD of `metric` at `point` across the store's blessed runs of the same workload, number of runs),
    or None with fewer than MIN_HISTORY_RUNS such runs. Blessings span commits, so genuine changes between
    them count as noise too: the floor is an upper bound on pure between-run drift."""
    path = Path(store) / "history.jsonl"
    if not path.exists():
        return None
    values = []
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        value = ((entry.get("point_stats") or {}).get(point) or {}).get(metric)
        if value and value > 0 and same_workload(entry.get("config") or {}):
            values.append(math.log(value))
    if len(values) < MIN_HISTORY_RUNS:
        return None
    return float(np.std(values, ddof=1)), len(values)


def calibration_gap(baseline: dict[str, Any] | None, candidate: dict[str, Any] | None) -> dict[str, float]:
    """Relative differences candidate / baseline - 1 of the machine-speed figures both runs recorded."""
    if not baseline or not candidate:
        return {}
    gaps = {}
    for key, base in baseline.items():
        cand = candidate.get(key)
        if isinstance(base, int | float) and isinstance(cand, int | float) and base > 0:
            gaps[key] = cand / base - 1.0
    return gaps
