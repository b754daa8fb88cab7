"""`bench sweep --repeats R`: the sweep's points measured R times, interleaved, into one run directory.

Repeats are the unit of replication for `bench gate`: between-run drift (CPU frequency, cache state,
neighbours) is larger than request-to-request noise, and only repeated runs show it. Repeat k runs every
point before repeat k+1 starts, in serpentine order (forward, then backward, ...), so no point always runs
first or last and a slow drift of the machine touches every point alike.

A point's published metrics pool the requests of all its repeats over their summed durations (so throughputs
are averages and latency percentiles are over every request); `repeats` keeps each repeat's own headline
figures and `repeat_spread` their relative spread (max / min - 1) for a quick look at between-run noise.
With a steady-state window (sweep.point.steady_state) the pooled figures are the windows': the requests inside
them, over the windows' summed lengths.
"""

from __future__ import annotations

from typing import Any

from sweep.point.benchmark_metrics import calculate_metrics
from sweep.point.records import RequestRecord
from sweep.point.saturation import is_saturated, saturated_verdict

HEADLINE_FIELDS = (
    "duration",
    "completed",
    "failed",
    "output_throughput",
    "median_ttft_ms",
    "median_tpot_ms",
    "mean_tpot_ms",
    "median_e2el_ms",
)


def repeat_order(values: list[float], repeats: int) -> list[tuple[int, float]]:
    """(repeat, load) in the order they run: every load per repeat, alternately forward and backward."""
    order: list[tuple[int, float]] = []
    for repeat in range(repeats):
        loads = values if repeat % 2 == 0 else values[::-1]
        order += [(repeat, value) for value in loads]
    return order


def pooled_point(
    repeat_points: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    percentiles: list[float],
    slo: dict[str, float] | None,
    queue_inclusive: bool,
) -> dict[str, Any]:
    """The point of a repeated measurement: metrics over every repeat's rows, plus each repeat's headline."""
    records = [RequestRecord.from_row(row) for row in rows]
    first = repeat_points[0]
    point: dict[str, Any] = {
        key: first[key] for key in ("label", "max_concurrency", "request_rate", "burstiness") if key in first
    }
    point["num_prompts"] = len(records)
    windowed = [p for p in repeat_points if p.get("window") == "steady"]
    if windowed:  # steady windows: the requests inside them, over the windows' summed lengths
        records = [r for r in records if r.in_window is not False]
    duration = sum(float(p["duration"]) for p in repeat_points)
    point.update(calculate_metrics(records, duration, percentiles, slo, queue_inclusive))
    if windowed:  # the windows' own throughputs (tokens by chunk time inside them), weighted by their lengths
        for key in ("output_throughput", "request_throughput"):
            point[key] = sum(float(p[key]) * float(p["duration"]) for p in repeat_points) / max(duration, 1e-9)
        point.pop("total_token_throughput", None)
        point.update(window="steady", window_rule=first.get("window_rule"))
    point["num_repeats"] = len(repeat_points)
    point["repeats"] = [{key: p.get(key) for key in HEADLINE_FIELDS} for p in repeat_points]
    point["repeat_spread"] = {
        key: spread([p.get(key) for p in repeat_points])
        for key in ("output_throughput", "median_ttft_ms", "median_tpot_ms")
    }
    point["fidelity"] = {**first.get("fidelity", {}), "repeats": [p.get("fidelity", {}) for p in repeat_points]}
    judged = [p for p in repeat_points if "saturated" in p]  # rate points: saturated when any repeat was
    if judged:
        verdicts = [saturated_verdict(p) for p in judged]
        point["saturated"] = True if True in verdicts else False if False in verdicts else None
        if point["saturated"] is None:  # no repeat was judged
            point["saturation"] = {"judged": False}
        if point["saturated"]:
            earliest = min((p for p in judged if is_saturated(p)), key=lambda p: p["saturated_at_s"])
            point["saturated_at_s"] = earliest["saturated_at_s"]
            point["saturation"] = {**earliest["saturation"], "repeats": [p.get("saturated_at_s") for p in judged]}
    return point


def spread(values: list[Any]) -> float | None:
    """max / min - 1 of positive figures (None when any is missing or not positive)."""
    numbers = [float(v) for v in values if isinstance(v, int | float)]
    if len(numbers) != len(values) or not numbers or min(numbers) <= 0:
        return None
    return max(numbers) / min(numbers) - 1.0
