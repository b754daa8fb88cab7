"""The tuner treats a point the over-saturation detector marked as failing the SLO, whatever its attainment."""

from __future__ import annotations

from typing import Any

from sweep.tune.objective import ObjectiveSpec, attainment_violation, evaluate, max_load_search


def rate_measure(saturates_above: float) -> Any:
    """Attainment 0.95 at every rate (a short point's queue has not yet hurt it), saturated above a rate."""
    def measure(load: float) -> dict[str, Any]:
        return {"request_rate": load, "slo_attainment": 0.95, "request_goodput": load,
                "saturated": load > saturates_above}
    return measure


def test_max_load_search_stops_below_the_saturated_rates() -> None:
    spec = ObjectiveSpec(load_mode="rate", min_load=1, max_load=64, rate_precision=0.05)
    result = max_load_search(spec, rate_measure(saturates_above=6.0))
    assert 6.0 * 0.95 <= result.values[0] <= 6.0
    assert not spec.passes({"slo_attainment": 1.0, "saturated": True}) and spec.passes({"slo_attainment": 1.0})


def test_a_saturated_fixed_load_misses_the_attainment_constraint() -> None:
    spec = ObjectiveSpec(kind="goodput", load_mode="rate", load=8, attainment=0.9)
    assert attainment_violation(spec, evaluate(spec, rate_measure(saturates_above=4.0))) == 0.9
    assert attainment_violation(spec, evaluate(spec, rate_measure(saturates_above=16.0))) == 0.0
