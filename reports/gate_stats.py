"""The gate's statistics: a sample's bootstrap interval, the bootstrap comparison of two runs' metric (with the
between-run noise floor), the Fisher exact test of failure rates, and Holm's adjustment (used by reports/gate.py)."""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import TYPE_CHECKING

import numpy as np

from reports.gate_noise import hierarchical_bootstrap, statistic, widen

if TYPE_CHECKING:
    from reports.gate import GateConfig


def bootstrap_ci(
    values: np.ndarray, stat: str | float = 50.0, n_boot: int = 2000, alpha: float = 0.05, seed: int = 0
) -> tuple[float, float, float]:
    """(statistic, CI low, CI high) of one sample's mean or percentile, percentile bootstrap."""
    values = np.asarray(values, dtype=float)
    boot = hierarchical_bootstrap([values], stat, n_boot, np.random.default_rng(seed))
    low, high = np.percentile(boot, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return float(statistic(values, stat)), float(low), float(high)


def compare_groups(
    baseline: list[np.ndarray],
    candidate: list[np.ndarray],
    stat: str | float,
    config: GateConfig,
    rng: np.random.Generator,
    noise_floor: float | None = None,
    higher_is_better: bool = False,
) -> tuple[float, float, float, float, float, float]:
    """(baseline stat, candidate stat, relative change, CI low, CI high, one-sided p for a regression: an increase,
    or a drop with `higher_is_better` (goodput)).

    Each side's bootstrap resamples its repeats, then requests within them; a side with one repeat gets the
    between-run `noise_floor` added instead (see reports/gate_noise.py)."""
    base_value = float(statistic(np.concatenate(baseline), stat))
    cand_value = float(statistic(np.concatenate(candidate), stat))
    boots = []
    for groups in (baseline, candidate):
        boot = hierarchical_bootstrap(groups, stat, config.n_boot, rng)
        if len(groups) == 1 and noise_floor:
            boot = widen(boot, noise_floor, rng)
        boots.append(boot)
    with np.errstate(divide="ignore", invalid="ignore"):
        changes = boots[1] / boots[0] - 1.0
        change = cand_value / base_value - 1.0 if base_value > 0 else math.inf if cand_value > 0 else 0.0
    changes = changes[np.isfinite(changes)]
    if not changes.size:
        return base_value, cand_value, change, math.nan, math.nan, 1.0
    low, high = np.percentile(changes, [100 * config.alpha / 2, 100 * (1 - config.alpha / 2)])
    no_regression = changes >= 0.0 if higher_is_better else changes <= 0.0
    p_value = (np.count_nonzero(no_regression) + 1) / (changes.size + 1)
    return base_value, cand_value, float(change), float(low), float(high), float(p_value)


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def compare_failures(base_failed: int, base_n: int, cand_failed: int, cand_n: int, alpha: float) -> tuple:
    """(baseline rate, candidate rate, difference, CI low, CI high, one-sided Fisher exact p for an increase).
    The interval is Agresti-Caffo's (one pseudo-failure and one pseudo-success added to each run)."""
    total, failures = base_n + cand_n, base_failed + cand_failed
    top = min(failures, cand_n)
    log_norm = _log_comb(total, cand_n)
    p_value = sum(
        math.exp(_log_comb(failures, k) + _log_comb(total - failures, cand_n - k) - log_norm)
        for k in range(cand_failed, top + 1)
    )
    base_rate, cand_rate = base_failed / base_n, cand_failed / cand_n
    pb, pc = (base_failed + 1) / (base_n + 2), (cand_failed + 1) / (cand_n + 2)
    z = NormalDist().inv_cdf(1 - alpha / 2)
    half = z * math.sqrt(pb * (1 - pb) / (base_n + 2) + pc * (1 - pc) / (cand_n + 2))
    diff = cand_rate - base_rate
    return base_rate, cand_rate, diff, pc - pb - half, pc - pb + half, min(1.0, p_value)


def holm(p_values: list[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (family-wise error control, any dependence)."""
    m = len(p_values)
    order = np.argsort(p_values)
    adjusted = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted.tolist()
