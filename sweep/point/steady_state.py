"""Steady-state windows: a point's figures without its ramp-up and drain, and the figures the results report.

A window is given (`--warmup-seconds W --cooldown-seconds C`: [t0 + W, end - C], where t0 is the point's start
and end its last response) or detected (`--steady-window auto`, `auto_window`: the point is cut into
AUTO_BINS equal bins, each bin's mean in-flight count is taken, and the window is the longest run of consecutive
bins whose mean lies within AUTO_BAND (25 %, and at least one request) of the median bin's; ties go to the
earliest run). Latency statistics are over the requests sent inside the window that also finished inside it (so
neither the first wave nor the drain's shrinking batch dilutes them); a request due inside the window but never
sent counts there as an SLO miss. Throughputs count what happened inside the window: output tokens by their
chunk times and completions by their last token, over the window's length.

When a window exists, `windowed_point` makes these the point's reported figures (`duration` is the window's
length), so summary.csv, reports, `bench gate`, the tuner and the `--max-load-under-slo` search all read them;
the point says so with `window: "steady"`, `window_rule`, `window_start_s`/`window_end_s` (from the point's
start), and keeps the whole point's figures under `full`. Every request row carries `in_window`, and reports
and the gate read only the rows inside (reports.importers).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from sweep.point.benchmark_metrics import calculate_metrics
from sweep.point.records import RequestRecord

AUTO_BINS = 20
AUTO_BAND = 0.25  # a bin's mean in-flight count within 25 % of the median bin's (and within 1 request)
WINDOW_RULES = ("fixed", "auto")
WINDOW_KEYS = ("window_start_s", "window_end_s")


def window_records(records: Sequence[RequestRecord], start: float, end: float) -> list[RequestRecord]:
    """Requests sent in [start, end] that finished by `end`; unsent ones by their due time."""
    return [r for r in records if in_window(r, start, end)]


def in_window(r: RequestRecord, start: float, end: float) -> bool:
    if not r.sent:
        return start <= r.intended_send_time <= end
    finish = r.last_token_time if r.success else r.end_time
    return start <= r.send_time and finish is not None and finish <= end


def window_metrics(
    records: Sequence[RequestRecord],
    t0: float,
    start_s: float,
    end_s: float,
    percentiles: Sequence[float],
    slo: dict[str, float] | None = None,
    queue_inclusive: bool = False,
) -> dict[str, Any]:
    """The point's metrics over [t0 + start_s, t0 + end_s] (seconds from the point's start)."""
    start, end = t0 + start_s, t0 + end_s
    inside = window_records(records, start, end)
    length = end - start
    metrics: dict[str, Any] = dict(calculate_metrics(inside, length, percentiles, slo, queue_inclusive))
    ok = [r for r in records if r.success]
    tokens = sum(n for r in ok for t, n in zip(r.chunk_times, r.chunk_tokens, strict=True) if start <= t <= end)
    completions = sum(start <= r.last_token_time <= end for r in ok)  # type: ignore[operator]
    metrics["output_throughput"] = tokens / length
    metrics["request_throughput"] = completions / length
    metrics.pop("total_token_throughput", None)  # prompt tokens have no time inside a window
    metrics["window_start_s"] = start_s
    metrics["window_end_s"] = end_s
    return metrics


def steady_metrics(
    records: Sequence[RequestRecord],
    t0: float,
    duration: float,
    warmup_s: float,
    cooldown_s: float,
    percentiles: Sequence[float],
    slo: dict[str, float] | None = None,
    queue_inclusive: bool = False,
) -> dict[str, Any] | None:
    """The point's metrics over its fixed steady window, or None when warm-up and cool-down leave no window."""
    if duration - cooldown_s <= warmup_s:
        return None
    return window_metrics(records, t0, warmup_s, duration - cooldown_s, percentiles, slo, queue_inclusive)


def in_flight_bins(records: Sequence[RequestRecord], t0: float, duration: float, bins: int) -> np.ndarray:
    """Mean number of requests in flight (sent, not yet finished) in each of `bins` equal bins of the point."""
    edges = np.linspace(t0, t0 + duration, bins + 1)
    busy = np.zeros(bins)
    for r in records:
        finish = r.last_token_time if r.success else r.end_time
        if not r.sent or finish is None:
            continue
        overlap = np.minimum(edges[1:], finish) - np.maximum(edges[:-1], r.send_time)
        busy += np.clip(overlap, 0.0, None)
    return busy / (duration / bins)


def auto_window(records: Sequence[RequestRecord], t0: float, duration: float) -> tuple[float, float] | None:
    """(start_s, end_s) of the detected steady window (the module's rule), or None for a point too short for it."""
    if duration <= 0 or not any(r.sent for r in records):
        return None
    level = in_flight_bins(records, t0, duration, AUTO_BINS)
    median = float(np.median(level))
    band = max(AUTO_BAND * median, 1.0)
    steady = np.abs(level - median) <= band
    best, run_start = (0, 0), None
    for i, ok in enumerate([*steady.tolist(), False]):
        if ok and run_start is None:
            run_start = i
        elif not ok and run_start is not None:
            if i - run_start > best[1] - best[0]:
                best = (run_start, i)
            run_start = None
    if best[1] - best[0] < 2:  # one bin is noise, not a steady state
        return None
    width = duration / AUTO_BINS
    return best[0] * width, best[1] * width


def windowed_point(
    point: dict[str, Any],
    records: Sequence[RequestRecord],
    t0: float,
    window: tuple[float, float],
    rule: str,
    percentiles: Sequence[float],
    slo: dict[str, float] | None,
    queue_inclusive: bool,
) -> dict[str, Any]:
    """`point` with the window's figures as its reported ones, the whole point's under `full`; marks every
    record's `in_window`."""
    start_s, end_s = window
    steady = window_metrics(records, t0, start_s, end_s, percentiles, slo, queue_inclusive)
    for r in records:
        r.in_window = in_window(r, t0 + start_s, t0 + end_s)
    full = {k: point[k] for k in steady.keys() | {"total_token_throughput"} if k in point and k not in WINDOW_KEYS}
    reported = {k: v for k, v in point.items() if k != "total_token_throughput"}
    reported.update(steady)
    reported.update(window="steady", window_rule=rule, full=full)
    return reported
