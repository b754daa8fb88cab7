"""The report's tables (pandas DataFrames) and their Markdown / HTML rendering."""

from __future__ import annotations

import html
import math
from typing import Any

import numpy as np
import pandas as pd

from reports.importers import RunData
from reports.recompute import percentile_key, ttft_decomposition
from sweep.point.saturation import saturated_verdict


def point_table(run: RunData) -> pd.DataFrame:
    """One row per point: load, counts, throughputs, latency percentiles, goodput and attainment."""
    pts = run.points
    table = pd.DataFrame({"point": pts["label"], "load": run.load_values().to_numpy()})
    table["completed"] = pts["completed"].to_numpy()
    table["failed"] = pts["failed"].to_numpy()
    if "cancelled" in pts and pd.to_numeric(pts["cancelled"], errors="coerce").fillna(0).any():  # --cancel-rate
        table["cancelled"] = pd.to_numeric(pts["cancelled"], errors="coerce").fillna(0).astype(int).to_numpy()
    table["req/s"] = pts["request_throughput"].to_numpy()
    table["out tok/s"] = pts["output_throughput"].to_numpy()
    for metric in ("ttft", "tpot", "e2el"):
        for p in run.percentiles:
            column = f"{percentile_key(p)}_{metric}_ms"
            if column in pts:
                values = pd.to_numeric(pts[column], errors="coerce").to_numpy()
                table[f"{metric.upper()} {percentile_key(p)} ms"] = values
    if "p90_e2el_including_client_queue_ms" in pts:  # open loop with a cap: from the intended send time
        values = pd.to_numeric(pts["p90_e2el_including_client_queue_ms"], errors="coerce").to_numpy()
        table["E2EL incl. queue p90 ms"] = values
    if "median_itl_ms" in pts:
        table["ITL p50 ms"] = pd.to_numeric(pts["median_itl_ms"], errors="coerce").to_numpy()
    top = percentile_key(max(run.percentiles))
    if f"{top}_max_stall_ms" in pts:  # each request's longest chunk gap: the tail of its distribution
        table[f"max stall {top} ms"] = pd.to_numeric(pts[f"{top}_max_stall_ms"], errors="coerce").to_numpy()
    if "request_goodput" in pts and pts["request_goodput"].notna().any():
        table["goodput req/s"] = pd.to_numeric(pts["request_goodput"], errors="coerce").to_numpy()
        table["SLO attainment"] = pd.to_numeric(pts["slo_attainment"], errors="coerce").to_numpy()
    if "classes" in pts:  # per-class SLOs: each class's goodput and attainment under its own SLO
        per_point = [c if isinstance(c, dict) else {} for c in pts["classes"]]
        for name in dict.fromkeys(name for classes in per_point for name in classes):
            for key, column in (("request_goodput", f"goodput {name} req/s"), ("slo_attainment", f"attainment {name}")):
                table[column] = [float("nan") if (v := c.get(name, {}).get(key)) is None else v for c in per_point]
    if "saturated" in pts:  # rate points the over-saturation detector watched
        table["saturated"] = [_saturation_cell(p) for p in pts.to_dict("records")]
    if "valid_output_fraction" in pts and pts["valid_output_fraction"].notna().any():  # structured outputs
        table["valid outputs"] = pd.to_numeric(pts["valid_output_fraction"], errors="coerce").to_numpy()
    return table


def window_note(run: RunData) -> str:
    """The report's line on which span of each point its figures cover ('' when every point is whole)."""
    if "window" not in run.points or not (run.points["window"] == "steady").any():
        return ""
    parts = []
    for _, point in run.points.iterrows():
        if point.get("window") == "steady":
            start, end = float(point["window_start_s"]), float(point["window_end_s"])
            rule = point.get("window_rule") or "fixed"
            parts.append(f"{point['label']} {start:.1f}-{end:.1f} s ({rule})")
        else:
            parts.append(f"{point['label']} whole point")
    return (f"{run.name}: figures over each point's steady-state window, in seconds from its start "
            f"(requests outside it are left out): {'; '.join(parts)}.")


def _ks(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic (max distance between the empirical CDFs)."""
    a, b = np.sort(a[np.isfinite(a)]), np.sort(b[np.isfinite(b)])
    if not a.size or not b.size:
        return math.nan
    grid = np.concatenate([a, b])
    cdf_a = np.searchsorted(a, grid, "right") / a.size
    cdf_b = np.searchsorted(b, grid, "right") / b.size
    return float(np.max(np.abs(cdf_a - cdf_b)))


def _num(rows: pd.DataFrame, column: str) -> np.ndarray:
    if column not in rows:
        return np.full(len(rows), np.nan)
    return pd.to_numeric(rows[column], errors="coerce").to_numpy(dtype=float)


def fidelity_table(run: RunData) -> pd.DataFrame:
    """Requested vs realised workload per point: lengths, early stops, token-count agreement, pacing."""
    records = []
    for _, point in run.points.iterrows():
        rows = run.point_requests(point["label"])
        ok = rows["success"].astype(bool).to_numpy()
        req_in, real_in = _num(rows, "requested_input_len")[ok], _num(rows, "prompt_tokens")[ok]
        req_out, real_out = _num(rows, "requested_output_len")[ok], _num(rows, "output_tokens")[ok]
        client_out = _num(rows, "client_output_tokens")[ok]
        lag_ms = (_num(rows, "send_time") - _num(rows, "intended_send_time")) * 1000.0
        record: dict[str, Any] = {
            "point": point["label"],
            "requests": len(rows),
            "input requested mean": np.nanmean(req_in) if np.isfinite(req_in).any() else math.nan,
            "input realised mean": np.nanmean(real_in) if np.isfinite(real_in).any() else math.nan,
            "input KS": _ks(req_in, real_in),
            "output requested mean": np.nanmean(req_out) if np.isfinite(req_out).any() else math.nan,
            "output realised mean": np.nanmean(real_out) if np.isfinite(real_out).any() else math.nan,
            "output KS": _ks(req_out, real_out),
            "early stops": float(np.mean(real_out < req_out)) if np.isfinite(req_out).any() else math.nan,
            "usage != client count": int(np.sum(np.isfinite(client_out) & (client_out != real_out))),
            "send lag p50 ms": float(np.nanpercentile(lag_ms, 50)) if np.isfinite(lag_ms).any() else math.nan,
            "send lag p99 ms": float(np.nanpercentile(lag_ms, 99)) if np.isfinite(lag_ms).any() else math.nan,
        }
        sweep_fidelity = point.get("fidelity") if isinstance(point.get("fidelity"), dict) else {}
        client = sweep_fidelity.get("client") or {}
        for column, value in (("offered req/s", sweep_fidelity.get("offered_rate_rps")),
                              ("achieved req/s", sweep_fidelity.get("achieved_rate_rps")),
                              ("inter-arrival CV", sweep_fidelity.get("achieved_iat_cv")),
                              ("tokens per chunk", client.get("tokens_per_chunk_mean"))):
            if value is not None:
                record[column] = value
        records.append(record)
    return pd.DataFrame(records)


def ttft_table(run: RunData) -> pd.DataFrame | None:
    """Mean server queue / prefill / rest of TTFT per point, when the run has server timing."""
    records = []
    for label in run.points["label"]:
        parts = ttft_decomposition(run.point_requests(label))
        if parts is not None:
            records.append({"point": label, **parts.mean().to_dict(), "requests": len(parts)})
    return pd.DataFrame(records) if records else None


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if math.isinf(value):
            return "inf"
        if value == int(value) and abs(value) < 1e6:
            return str(int(value))
        return f"{value:.3g}" if abs(value) < 1 else f"{value:,.1f}" if abs(value) < 1e5 else f"{value:,.0f}"
    return str(value)


def to_markdown(table: pd.DataFrame) -> str:
    header = "| " + " | ".join(str(c) for c in table.columns) + " |"
    rule = "|" + "|".join("---" for _ in table.columns) + "|"
    body = ["| " + " | ".join(_fmt(v).replace("|", "\\|") for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join([header, rule, *body])


def to_html(table: pd.DataFrame) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in table.columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in row) + "</tr>"
        for row in table.itertuples(index=False)
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _saturation_cell(point: dict) -> str:
    verdict = saturated_verdict(point)
    if verdict:
        return f"at {point['saturated_at_s']:.1f} s"
    evidence = point.get("saturation")
    if isinstance(evidence, dict) and evidence.get("judged") is False:
        return "not judged"  # the point ended before a whole window past its ramp-up
    return "no" if verdict is False else "-"
