"""Point metrics recomputed from stored per-request rows, through the sweep's own vLLM-exact functions.

Reports and the gate work on DataFrames (`requests.jsonl` rows, or imported vLLM / GuideLLM data); this
module turns rows back into `sweep.point.records.RequestRecord`s and calls `sweep.point.benchmark_metrics` (vLLM's
`calculate_metrics`, `is_good`, `request_tpot`), so re-evaluating a run under another SLO gives exactly the
numbers `bench sweep` would have written. Nothing is rerun.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from sweep.point.benchmark_metrics import (
    CLASS_SEP,
    DEFAULT_PERCENTILES,
    SLO_KEYS,
    VALID_SLO_KEY,
    calculate_metrics,
    class_metrics,
    is_good,
    percentile_name,
    queue_inclusive_applies,
    request_itl_p99,
    request_max_stall,
    request_tpot,
)
from sweep.point.benchmark_metrics import (
    parse_slo as parse_slo,  # re-exported: `ttft=MS,tpot=MS,...` -> {"ttft_ms": ...}
)
from sweep.point.benchmark_metrics import ttft_decomposition as record_ttft_decomposition
from sweep.point.records import RequestRecord

# The gate's metrics: itl is every chunk gap pooled; itl_p99 and max_stall are per request (request_latencies'
# columns, computed by the per-token SLOs' own functions).
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el", "itl_p99", "max_stall")
percentile_key = percentile_name


class SLOError(ValueError):
    """An SLO specification that cannot be used."""


def normalize_slo(slo: Mapping[str, float] | None) -> dict[str, float] | None:
    """Accept `{"ttft": 200}` or `{"ttft_ms": 200}` (ms), and per-class limits as `{"interactive:ttft_ms": 200}`;
    drop None values; None when empty."""
    if not slo:
        return None
    out: dict[str, float] = {}
    for key, value in slo.items():
        request_class, sep, metric = str(key).rpartition(CLASS_SEP)
        prefix = f"{request_class}{sep}"
        name = metric.lower().removesuffix("_ms")
        if name == VALID_SLO_KEY:
            if value not in (None, 0, 1):
                raise SLOError(f"SLO valid must be 1 (structured outputs must validate) or 0, got {value!r}")
            if value:
                out[f"{prefix}{VALID_SLO_KEY}"] = 1.0
            continue
        if name not in SLO_KEYS:
            raise SLOError(f"unknown SLO metric {key!r}: expected one of {', '.join(SLO_KEYS)}")
        if value is not None:
            if not math.isfinite(float(value)) or float(value) < 0:
                raise SLOError(f"SLO {name} must be a finite number of ms >= 0, got {value!r}")
            out[f"{prefix}{name}_ms"] = float(value)
    return out or None


def format_slo(slo: Mapping[str, float] | None) -> str:
    """`TTFT <= 500 ms, TPOT <= 50 ms`; per-class limits follow as `; batch: E2EL <= 20000 ms`."""
    if not slo:
        return "none"
    groups: dict[str, list[str]] = {}
    for key, value in slo.items():
        request_class, _, metric = key.rpartition(CLASS_SEP)
        limit = f"{metric.removesuffix('_ms').upper()} <= {value:g} ms"
        text = "valid structured output" if metric == VALID_SLO_KEY else limit
        groups.setdefault(request_class, []).append(text)
    return "; ".join(f"{name}: {', '.join(items)}" if name else ", ".join(items) for name, items in groups.items())


def _scalar(value: Any) -> Any:
    """pandas fills missing cells with NaN; the records want None."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value.item() if hasattr(value, "item") else value


def _int(value: Any) -> int | None:
    value = _scalar(value)
    return None if value is None else int(value)


def records_from_rows(rows: pd.DataFrame) -> list[RequestRecord]:
    """Rebuild the sweep's request records from stored rows (TTFT/E2EL/ITL derive from the timestamps)."""
    records = []
    for row in rows.to_dict("records"):
        send = _scalar(row.get("send_time"))
        chunk_times = list(row["chunk_times"]) if isinstance(row.get("chunk_times"), list) else []
        # Sources without per-chunk counts (vLLM's detailed JSON) count one token per chunk, as vLLM does.
        chunk_tokens = list(row["chunk_tokens"]) if isinstance(row.get("chunk_tokens"), list) else []
        chunk_tokens = chunk_tokens or [1] * len(chunk_times)
        records.append(
            RequestRecord(
                index=_int(row.get("index")) or 0,
                requested_input_len=_int(row.get("requested_input_len")),
                requested_output_len=_int(row.get("requested_output_len")),
                intended_send_time=_scalar(row.get("intended_send_time")),
                send_time=send if send is not None else 0.0,
                sent=bool(_scalar(row.get("sent"))) if _scalar(row.get("sent")) is not None else True,
                success=bool(_scalar(row.get("success"))),
                cancelled=bool(_scalar(row.get("cancelled"))),
                error=_scalar(row.get("error")),
                first_token_time=_scalar(row.get("first_token_time")),
                last_token_time=_scalar(row.get("last_token_time")),
                end_time=_scalar(row.get("end_time")),
                chunk_times=chunk_times,
                chunk_tokens=chunk_tokens,
                prompt_tokens=_int(row.get("prompt_tokens")),
                output_tokens=_int(row.get("output_tokens")),
                client_prompt_tokens=_int(row.get("client_prompt_tokens")),
                client_output_tokens=_int(row.get("client_output_tokens")),
                server_timing=row.get("server_timing") if isinstance(row.get("server_timing"), dict) else None,
                output_valid=None if (valid := _scalar(row.get("output_valid"))) is None else bool(valid),
                request_class=None if (cls := _scalar(row.get("request_class"))) is None else str(cls),
            )
        )
    return records


def request_latencies(rows: pd.DataFrame) -> pd.DataFrame:
    """Per-request TTFT / TPOT / E2EL and own p99 chunk gap / longest chunk gap (`itl_p99_ms`, `max_stall_ms`) in ms;
    NaN for failures (TPOT NaN for outputs of <= 1 token, the gap columns for outputs of <= 1 chunk)."""
    records = records_from_rows(rows)
    nan = float("nan")
    frame = pd.DataFrame(
        {
            "ttft_ms": [r.ttft * 1000.0 if r.success and r.ttft is not None else nan for r in records],
            "tpot_ms": [t * 1000.0 if (t := request_tpot(r)) is not None else nan for r in records],
            "e2el_ms": [r.e2el * 1000.0 if r.success and r.e2el is not None else nan for r in records],
            "itl_p99_ms": [g * 1000.0 if (g := request_itl_p99(r)) is not None else nan for r in records],
            "max_stall_ms": [g * 1000.0 if (g := request_max_stall(r)) is not None else nan for r in records],
            "output_tokens": [r.output_tokens or 0 for r in records],
            "success": [r.success for r in records],
        },
        index=rows.index,
    )
    return frame


def pooled_itl_ms(rows: pd.DataFrame) -> np.ndarray:
    """Every chunk gap of every successful request, in ms (vLLM's pooled ITL)."""
    gaps = [gap for r in records_from_rows(rows) if r.success for gap in r.itl]
    return np.asarray(gaps, dtype=float) * 1000.0


def good_mask(rows: pd.DataFrame, slo: Mapping[str, float] | None) -> np.ndarray:
    """vLLM's good request per row: success and every given SLO met."""
    slo = normalize_slo(slo) or {}
    return np.array([is_good(r, slo) for r in records_from_rows(rows)], dtype=bool)


def goodput(rows: pd.DataFrame, duration: float, slo: Mapping[str, float] | None) -> tuple[float | None, float | None]:
    """(request_goodput, slo_attainment) for one point; (None, None) without an SLO."""
    if not normalize_slo(slo):
        return None, None
    good = int(good_mask(rows, slo).sum())
    judged = len(rows) - int(cancelled_mask(rows).sum())  # client-cancelled requests are out of the denominator
    return good / max(duration, 1e-9), (good / judged if judged else None)


def cancelled_mask(rows: pd.DataFrame) -> np.ndarray:
    """Rows the client aborted on purpose (`bench sweep --cancel-rate`); all False for runs without the field."""
    if "cancelled" not in rows:
        return np.zeros(len(rows), dtype=bool)
    return rows["cancelled"].fillna(False).astype(bool).to_numpy()


def point_metrics(
    rows: pd.DataFrame,
    duration: float,
    percentiles: Iterable[float] = DEFAULT_PERCENTILES,
    slo: Mapping[str, float] | None = None,
    max_concurrency: int | None = None,
    request_rate: float | str | None = None,
) -> dict[str, float | int | None]:
    """One point's vLLM result fields from its per-request rows (`sweep.point.benchmark_metrics.calculate_metrics`).

    Queue-inclusive latency by the sweep's rule: only for an open loop (`request_rate`) with a `max_concurrency`."""
    records = records_from_rows(rows)
    queue_inclusive = queue_inclusive_applies(max_concurrency, request_rate) and all(
        r.intended_send_time is not None for r in records
    )
    return calculate_metrics(records, duration, tuple(percentiles), normalize_slo(slo), queue_inclusive)


def with_slo(points: pd.DataFrame, requests: pd.DataFrame, slo: Mapping[str, float] | None) -> pd.DataFrame:
    """Points with `request_goodput` and `slo_attainment` recomputed from the stored requests under `slo`."""
    points = points.copy()
    slo = normalize_slo(slo)
    if slo is None:
        return points
    groups = {label: rows for label, rows in requests.groupby("label", sort=False)}
    empty = requests.iloc[0:0]
    values = [goodput(groups.get(p["label"], empty), float(p["duration"]), slo) for _, p in points.iterrows()]
    points["request_goodput"] = [g for g, _ in values]
    points["slo_attainment"] = [a for _, a in values]
    classes = [
        class_metrics(records_from_rows(groups.get(p["label"], empty)), float(p["duration"]), slo)
        for _, p in points.iterrows()
    ]
    if any(classes):  # per-class figures under this SLO (requests carry classes, or the SLO names some)
        points["classes"] = [c or None for c in classes]
    elif "classes" in points:
        points = points.drop(columns=["classes"])
    return points


def ttft_decomposition(rows: pd.DataFrame) -> pd.DataFrame | None:
    """Per-request server queue / prefill / rest of TTFT (ms) from the server timing; None without it."""
    records = records_from_rows(rows)
    parts = {idx: d for idx, r in zip(rows.index, records, strict=True) if (d := record_ttft_decomposition(r))}
    if not parts:
        return None
    frame = pd.DataFrame.from_dict(parts, orient="index", columns=["queue_ms", "prefill_ms", "ttft_rest_ms"])
    return frame * 1000.0
