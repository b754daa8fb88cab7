"""`bench gate --slo SPEC`: SLO attainment rows, for every request and for each request class.

The SLO is the sweep's (`sweep.point.benchmark_metrics.parse_slo`): any of ttft, tpot, e2el, itl_p99 (each
request's own p99 chunk gap), max_stall (its longest gap) and `valid`, with per-class sections
(`e2el=30000;interactive:ttft=500`). Each point gets a `slo_attainment` row (all requests) and one
`slo_attainment[CLASS]` row per class that the SLO names or either run's requests carry. A row compares the
share of requests that missed the SLO (failures count as misses; client-cancelled requests are left out, as in
the sweep's `slo_attainment`) with the one-sided Fisher exact test the gate uses for `failure_rate`; its values
are attainments (good / judged) and its change is the candidate's minus the baseline's, in percentage points, so
a drop is negative. reports/gate.py puts the p-values into its Holm family and fails a row whose drop is
significant and larger than `--max-attainment-drop`.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from reports.gate_stats import compare_failures
from reports.importers import RunData
from reports.recompute import SLOError, cancelled_mask, good_mask, normalize_slo
from sweep.point.benchmark_metrics import slo_classes

ATTAINMENT = "slo_attainment"


def attainment_metric(request_class: str | None) -> str:
    """`slo_attainment` for every request, `slo_attainment[batch]` for one class's."""
    return ATTAINMENT if request_class is None else f"{ATTAINMENT}[{request_class}]"


def is_attainment(metric: str) -> bool:
    return metric == ATTAINMENT or metric.startswith(f"{ATTAINMENT}[")


def _run_classes(run: RunData) -> list[str]:
    if "request_class" not in run.requests:
        return []
    return sorted({str(c) for c in run.requests["request_class"].dropna()})


def gate_classes(baseline: RunData, candidate: RunData, slo: Mapping[str, float]) -> list[str]:
    """The classes that get rows: the SLO's, then the others either run carries. SLOError when the SLO names a
    class neither run's requests carry (a typo would otherwise gate nothing)."""
    carried = sorted(set(_run_classes(baseline)) | set(_run_classes(candidate)))
    named = slo_classes(dict(slo))
    unknown = [name for name in named if name not in carried]
    if unknown:
        have = f"their classes are {carried}" if carried else "their requests carry none"
        raise SLOError(f"--slo names unknown class(es) {unknown}: {have}")
    return list(dict.fromkeys([*named, *carried]))


def miss_counts(rows: pd.DataFrame, slo: Mapping[str, float], request_class: str | None = None) -> tuple[int, int]:
    """(requests that missed the SLO, requests judged) of one point's rows, optionally of one class only."""
    rows = rows[~cancelled_mask(rows)]
    if request_class is not None:
        rows = rows[rows["request_class"] == request_class] if "request_class" in rows else rows.iloc[0:0]
    judged = len(rows)
    return judged - int(good_mask(rows, slo).sum()), judged


def attainment_tests(
    baseline: RunData, candidate: RunData, labels: list[str], slo: Mapping[str, float], alpha: float
) -> list[tuple[str, str, tuple[float, float, float, float, float, float], int, int]]:
    """Per point and class: (label, metric, (baseline attainment, candidate attainment, change, CI low, CI high,
    one-sided p for a drop), judged in baseline, judged in candidate). A class with no judged request in either
    run at a point gets no row there."""
    normalized = normalize_slo(slo)
    if not normalized:
        return []
    classes: list[str | None] = [None, *gate_classes(baseline, candidate, normalized)]
    out = []
    for label in labels:
        base_rows, cand_rows = baseline.point_requests(label), candidate.point_requests(label)
        for request_class in classes:
            base_missed, base_n = miss_counts(base_rows, normalized, request_class)
            cand_missed, cand_n = miss_counts(cand_rows, normalized, request_class)
            if not base_n or not cand_n:
                continue
            base_miss, cand_miss, diff, low, high, p_value = compare_failures(
                base_missed, base_n, cand_missed, cand_n, alpha
            )
            values = (1.0 - base_miss, 1.0 - cand_miss, -diff, -high, -low, p_value)
            out.append((label, attainment_metric(request_class), values, base_n, cand_n))
    return out
