"""Rate-curve arrivals (`bench sweep --request-rate R,... --rate-curve CURVE`): each rate point's requests follow a
piecewise-constant rate curve, rescaled to the point's mean rate R (`workloads.arrivals.rate_curve`).

CURVE is comma-separated relative window rates (`1,4,2`: a quarter-rate window, a peak, a half-rate window) or a
shipped mix with a rate curve (`servegen-deepseek-r1`: ServeGen's 144 ten-minute windows of one day). Only the
shape counts: the curve is rescaled so its mean is R and stretched over the point's `--duration` (without one,
over --num-prompts / R seconds); `--burstiness` shapes the gaps within it (1: an inhomogeneous Poisson process).
"""

from __future__ import annotations

import math
from typing import Any

FLAG = "--rate-curve"


def check_rate_curve(curve: list[float]) -> None:
    if not curve or any(not math.isfinite(r) or r < 0 for r in curve) or sum(curve) <= 0:
        raise ValueError(f"{FLAG} needs non-negative finite window rates with a positive sum, got {curve}")


def parse_rate_curve(text: str) -> list[float]:
    """The curve's window rates from comma-separated numbers or a shipped mix's name."""
    import workloads

    name = text.strip()
    if name in workloads.mixes.shipped_names():
        if not _has_curve(name):
            with_curves = [n for n in workloads.mixes.shipped_names() if _has_curve(n)]
            raise ValueError(f"{FLAG}: shipped mix {name!r} has no rate curve; these do: {with_curves}")
        return [float(r) for r in workloads.metadata(name)["arrivals"]["aggregate_rate_rps"]]
    try:
        curve = [float(part) for part in name.split(",") if part.strip()]
    except ValueError:
        raise ValueError(
            f"{FLAG} takes comma-separated relative window rates (e.g. 1,4,2) or a shipped mix with a rate curve "
            f"(e.g. servegen-deepseek-r1), got {text!r}"
        ) from None
    check_rate_curve(curve)
    return curve


def _has_curve(name: str) -> bool:
    import workloads

    return "aggregate_rate_rps" in (workloads.metadata(name).get("arrivals") or {})


def rate_curve_fields(
    curve: tuple[float, ...], rate: float, num_prompts: int | None, duration: float | None
) -> dict[str, Any]:
    """The point's description of its curve: windows, each window's length, and the peak window's rate."""
    span = duration if duration is not None else (num_prompts or 0) / rate
    mean = sum(curve) / len(curve)
    return {
        "rate_curve_windows": len(curve),
        "rate_curve_window_s": span / len(curve),
        "rate_curve_peak_rps": max(curve) / mean * rate,
    }
