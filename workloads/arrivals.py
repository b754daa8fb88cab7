"""Arrival schedules as absolute send offsets in seconds from the run start (never relative sleeps, which drift).

A runner sends request i at start + offsets[i]; if it falls behind it sends at once and reports the lag.
Burstiness follows vLLM: gaps are Gamma(shape=burstiness, scale=1/(rate*burstiness)), so the mean rate is
`rate` and the inter-arrival CV is 1/sqrt(burstiness): 1 is Poisson, lower is burstier, higher is smoother.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

RAMP_KINDS = ("linear", "exponential")


def closed_loop(num_requests: int) -> list[float]:
    """Closed loop at fixed concurrency (vLLM --request-rate inf with --max-concurrency): every request is due at
    once and the runner's concurrency cap admits the next one as soon as one finishes."""
    return [0.0] * num_requests


def _check(rate: float, num_requests: int) -> None:
    if not rate > 0 or math.isinf(rate):
        raise ValueError(f"rate must be a positive finite number of requests/s, got {rate}")
    if num_requests < 0:
        raise ValueError(f"num_requests must be >= 0, got {num_requests}")


def _cumulative(gaps: np.ndarray) -> list[float]:
    """The first request goes at 0; each later one a gap after its predecessor."""
    if gaps.size == 0:
        return []
    offsets = np.concatenate([[0.0], np.cumsum(gaps[1:])])
    return offsets.tolist()


def gamma(rate: float, burstiness: float, num_requests: int, seed: int = 0) -> list[float]:
    """Gamma-renewal arrivals at mean `rate` req/s; burstiness 1 = Poisson, < 1 burstier (CV = 1/sqrt(b))."""
    _check(rate, num_requests)
    if not burstiness > 0:
        raise ValueError(f"burstiness must be > 0, got {burstiness}")
    rng = np.random.default_rng(seed)
    return _cumulative(rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=num_requests))


def poisson(rate: float, num_requests: int, seed: int = 0) -> list[float]:
    """Poisson arrivals: exponential gaps with mean 1/rate."""
    return gamma(rate, 1.0, num_requests, seed)


def constant(rate: float, num_requests: int) -> list[float]:
    """Evenly spaced requests (burstiness -> infinity)."""
    _check(rate, num_requests)
    return [index / rate for index in range(num_requests)]


def ramp(
    start_rate: float,
    end_rate: float,
    num_requests: int,
    kind: str = "linear",
    burstiness: float = 1.0,
    seed: int = 0,
) -> list[float]:
    """vLLM --ramp-up-strategy: request i's gap is drawn at the rate reached at progress i/(n-1), linearly
    (start + (end-start)p) or exponentially (start * (end/start)^p) from start_rate to end_rate."""
    if kind not in RAMP_KINDS:
        raise ValueError(f"ramp kind must be one of {RAMP_KINDS}, got {kind!r}")
    _check(start_rate, num_requests)
    _check(end_rate, num_requests)
    if not burstiness > 0:
        raise ValueError(f"burstiness must be > 0, got {burstiness}")
    progress = np.arange(num_requests) / max(num_requests - 1, 1)
    if kind == "linear":
        rates = start_rate + (end_rate - start_rate) * progress
    else:
        rates = start_rate * (end_rate / start_rate) ** progress
    rng = np.random.default_rng(seed)
    return _cumulative(rng.gamma(shape=burstiness, scale=1.0, size=num_requests) / (rates * burstiness))


def replay(timestamps: Sequence[float], time_scale: float = 1.0, tick_s: float | None = None) -> list[float]:
    """Trace replay: offsets = (t - t0) * time_scale (2 = half speed, 0.5 = double speed).

    tick_s spreads requests that share a quantized timestamp evenly over the tick (Mooncake stamps in 3 s ticks:
    tick_s=3); order is preserved. Timestamps must be non-decreasing.
    """
    if not time_scale > 0:
        raise ValueError(f"time_scale must be > 0, got {time_scale}")
    times = np.asarray(timestamps, dtype=np.float64)
    if times.size == 0:
        return []
    if np.any(np.diff(times) < 0):
        first = int(np.argmax(np.diff(times) < 0)) + 1
        raise ValueError(f"replay needs non-decreasing timestamps; request {first} goes back in time")
    times = times - times[0]
    if tick_s is not None:
        if not tick_s > 0:
            raise ValueError(f"tick_s must be > 0, got {tick_s}")
        spread = times.copy()
        start = 0
        while start < times.size:
            end = start
            while end < times.size and times[end] == times[start]:
                end += 1
            group = end - start
            width = min(tick_s, times[end] - times[start]) if end < times.size else tick_s  # stay in order
            spread[start:end] = times[start] + width * np.arange(group) / group
            start = end
        times = spread
    return (times * time_scale).tolist()


def rate_curve(
    window_rates: Sequence[float],
    num_requests: int,
    mean_rate: float,
    duration_s: float | None = None,
    burstiness: float = 1.0,
    seed: int = 0,
) -> list[float]:
    """Arrivals following a piecewise-constant rate curve (e.g. ServeGen's diurnal per-window rates).

    The curve's shape is kept and rescaled to `mean_rate`; it is stretched over duration_s (default: one pass,
    num_requests / mean_rate) and repeats if the requests outlast it. Within the curve, gaps are a Gamma renewal
    process with the given burstiness in the curve's cumulative-rate time, so burstiness 1 is an inhomogeneous
    Poisson process.
    """
    _check(mean_rate, num_requests)
    if not burstiness > 0:
        raise ValueError(f"burstiness must be > 0, got {burstiness}")
    shape = np.asarray(window_rates, dtype=np.float64)
    if shape.size == 0 or np.any(shape < 0) or shape.sum() <= 0:
        raise ValueError("window_rates must be non-negative with a positive sum")
    duration = num_requests / mean_rate if duration_s is None else duration_s
    if not duration > 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    rng = np.random.default_rng(seed)
    operational = _cumulative(rng.gamma(shape=burstiness, scale=1.0 / burstiness, size=num_requests))
    window = duration / shape.size
    expected_per_window = shape / shape.mean() * mean_rate * window
    cycles = int(np.ceil((operational[-1] + 1.0) / expected_per_window.sum())) if operational else 1
    counts = np.tile(expected_per_window, cycles)
    edges = np.concatenate([[0.0], np.cumsum(counts)])
    # the last window edge at or below each operational time; side="right" skips zero-rate windows
    index = np.searchsorted(edges, operational, side="right") - 1
    return (index * window + (np.asarray(operational) - edges[index]) / counts[index] * window).tolist()
