"""The point fields of the load shapes and measurements beyond a plain point: trace replay, multi-turn sessions,
vLLM's ramp-up, rate curves, the server's /metrics (sweep.point.server_metrics), and the steady-state window
the point's figures are reported over (sweep.point.steady_state)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sweep.point.runner import PointRun
from sweep.point.steady_state import auto_window


def extra_point_fields(
    run: PointRun,
    percentiles: Sequence[float],
    slo: dict[str, float] | None,
    queue_inclusive: bool,
) -> dict[str, Any]:
    """Fields to add to the point dict."""
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
    if run.server_metrics:  # flat, so summary.csv and reports see them; vLLM's names for spec decode
        fields.update(run.server_metrics)
    return fields


def point_window(
    run: PointRun, warmup_s: float, cooldown_s: float, auto: bool
) -> tuple[tuple[float, float] | None, str] | None:
    """The steady window asked for, as ((start_s, end_s) from the point's start, rule): None when no window was
    asked for; a window of None when the point leaves none (too short for --warmup/--cooldown-seconds, or no
    steady span detected)."""
    if auto:
        return auto_window(run.records, run.t0, run.duration), "auto"
    if not (warmup_s or cooldown_s):
        return None
    end_s = run.duration - cooldown_s
    return ((warmup_s, end_s) if end_s > warmup_s else None), "fixed"
