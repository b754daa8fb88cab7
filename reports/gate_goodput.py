"""`bench gate --slo SPEC`: goodput rows (vLLM's `request_goodput`: requests/s that met the SLO), overall and per
request class.

Each point gets a `request_goodput` row over every request and one `request_goodput[CLASS]` row per class that
gets `slo_attainment` rows (reports/gate_slo.gate_classes), each request judged by its own class's limits
(reports.recompute.good_mask, the sweep's `is_good`). The rows are judged like the latency rows: every request
contributes good (1 or 0) x requests / duration of its repeat, so the mean over a repeat's requests is that
repeat's goodput (good / duration, as the sweep writes it), and reports/gate_stats.compare_groups resamples
repeats and then requests (with the noise floor for a side measured once), giving the relative change, its
interval and a one-sided p-value for a *drop*. reports/gate.py puts the p-values into its Holm family and fails
a row whose drop is significant and larger than `--max-goodput-drop` (relative, like `--max-regression`).

With repeats, the row's value is the repeats' goodputs averaged with their request counts as weights; the
pooled point's `request_goodput` divides all good requests by the summed durations, which differs only when the
repeats' durations differ. Client-cancelled requests count in the point's requests (never good), as in the sweep.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from reports.importers import RunData
from reports.recompute import good_mask

GOODPUT = "request_goodput"


def goodput_metric(request_class: str | None) -> str:
    """`request_goodput` for every request, `request_goodput[batch]` for one class's."""
    return GOODPUT if request_class is None else f"{GOODPUT}[{request_class}]"


def is_goodput(metric: str) -> bool:
    return metric == GOODPUT or metric.startswith(f"{GOODPUT}[")


def _repeat_durations(run: RunData, label: str) -> list[float]:
    """Each repeat's duration in s (the pooled point's `repeats`), or [the point's duration] without repeats."""
    point: dict[str, Any] = run.points[run.points["label"] == label].iloc[0].to_dict()
    repeats = point.get("repeats")
    if isinstance(repeats, list) and repeats and all(isinstance(r, dict) and r.get("duration") for r in repeats):
        return [float(r["duration"]) for r in repeats]
    return [float(point["duration"])]


def goodput_groups(
    run: RunData, label: str, slo: Mapping[str, float], classes: list[str | None]
) -> dict[str | None, list[np.ndarray]]:
    """For every request class in `classes` (None: every request), per repeat (one array without repeats): good
    (1/0) x requests / duration for each of the point's requests of that class; a repeat without such requests
    gives no array."""
    rows = run.point_requests(label)
    durations = _repeat_durations(run, label)
    repeated = "repeat" in rows and rows["repeat"].notna().any()
    parts = [part for _, part in rows.groupby("repeat", sort=True)] if repeated else [rows]
    total = sum(len(part) for part in parts) or 1
    groups: dict[str | None, list[np.ndarray]] = {request_class: [] for request_class in classes}
    for position, part in enumerate(parts):  # the k-th repeat's rows, the k-th of the point's `repeats`
        # points without per-repeat durations: each repeat gets its share of the pooled duration
        duration = durations[position] if len(durations) == len(parts) else durations[0] * len(part) / total
        good = good_mask(part, slo).astype(float)
        for request_class in classes:
            values = good if request_class is None else good[_class_members(part, request_class)]
            if values.size:
                groups[request_class].append(values * values.size / max(duration, 1e-9))
    return groups


def _class_members(rows: pd.DataFrame, request_class: str) -> np.ndarray:
    if "request_class" not in rows:
        return np.zeros(len(rows), dtype=bool)
    return (rows["request_class"] == request_class).to_numpy(dtype=bool)
