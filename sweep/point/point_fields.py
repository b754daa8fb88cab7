"""The point fields of the load shapes and measurements beyond a plain point: trace replay, multi-turn sessions,
vLLM's ramp-up, rate curves, the steady-state window (sweep.point.steady_state) and the server's /metrics
(sweep.point.server_metrics)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sweep.point.runner import PointRun
from sweep.point.steady_state import steady_metrics


def extra_point_fields(
    run: PointRun,
    percentiles: Sequence[float],
    slo: dict[str, float] | None,
    queue_inclusive: bool,
    warmup_s: float = 0.0,
    cooldown_s: float = 0.0,
) -> dict[str, Any]:
    """Fields to add to the point dict; `steady` is None when the point was shorter than the two windows."""
    spec, fields = run.spec, {}
    if spec.mode == "replay":
        fields["time_scale"] = spec.time_scale
    if spec.turns > 1 or any(r.session is not None for r in run.records):
        fields["sessions"] = len({r.session for r in run.records if r.session is not None})
    if spec.ramp is not None:  # vLLM's result fields; request_rate is the end rate
        fields.update(ramp_up_strategy=spec.ramp[0], ramp_up_start_rps=spec.ramp[1], ramp_up_end_rps=spec.ramp[2])
    if spec.rate_curve is not None:
        from workloads.rate_curve import rate_curve_fields

        fields.update(rate_curve_fields(spec.rate_curve, spec.rate, spec.num_prompts, spec.duration))
    if warmup_s or cooldown_s:
        fields["steady"] = steady_metrics(
            run.records, run.t0, run.duration, warmup_s, cooldown_s, percentiles, slo, queue_inclusive
        )
    if run.server_metrics:  # flat, so summary.csv and reports see them; vLLM's names for spec decode
        fields.update(run.server_metrics)
    return fields
