"""Steady-state windows: a point's figures without its ramp-up and drain (`--warmup-seconds`/`--cooldown-seconds`).

The window is [t0 + warmup, end - cooldown], where t0 is the point's start and end its last response. Latency
statistics are over the requests sent inside the window that also finished inside it (so neither the first wave
nor the drain's shrinking batch dilutes them); a request due inside the window but never sent counts there as
an SLO miss. Throughputs count what happened inside the window: output tokens by their chunk times and
completions by their last token, over the window's length. The full point's figures are kept; these go under
the point's `steady` key.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sweep.point.benchmark_metrics import calculate_metrics
from sweep.point.records import RequestRecord


def window_records(records: Sequence[RequestRecord], start: float, end: float) -> list[RequestRecord]:
    """Requests sent in [start, end] that finished by `end`; unsent ones by their due time."""
    inside = []
    for r in records:
        if not r.sent:
            if start <= r.intended_send_time <= end:
                inside.append(r)
            continue
        finish = r.last_token_time if r.success else r.end_time
        if start <= r.send_time and finish is not None and finish <= end:
            inside.append(r)
    return inside


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
    """The point's metrics over its steady window, or None when warm-up and cool-down leave no window."""
    start, end = t0 + warmup_s, t0 + duration - cooldown_s
    if end <= start:
        return None
    inside = window_records(records, start, end)
    length = end - start
    metrics: dict[str, Any] = dict(calculate_metrics(inside, length, percentiles, slo, queue_inclusive))
    ok = [r for r in records if r.success]
    tokens = sum(n for r in ok for t, n in zip(r.chunk_times, r.chunk_tokens, strict=True) if start <= t <= end)
    completions = sum(start <= r.last_token_time <= end for r in ok)  # type: ignore[operator]
    metrics["output_throughput"] = tokens / length
    metrics["request_throughput"] = completions / length
    metrics.pop("total_token_throughput", None)  # prompt tokens have no time inside a window
    metrics["window_start_s"] = warmup_s
    metrics["window_end_s"] = duration - cooldown_s
    return metrics
