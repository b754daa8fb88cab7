from __future__ import annotations

from typing import Any

import pytest

from sweep.tune.objective import (
    Evaluation,
    ObjectiveSpec,
    attainment_violation,
    combine_repeats,
    evaluate,
    max_load_search,
)


def capacity_measure(capacity: float, log: list[float]) -> Any:
    def measure(load: float) -> dict[str, Any]:
        log.append(load)
        return {"max_concurrency": load, "slo_attainment": 0.95 if load <= capacity else 0.4,
                "request_goodput": min(load, capacity), "p90_ttft_ms": 5.0 * load}
    return measure


@pytest.mark.parametrize("capacity", [1, 3, 5, 12, 64])
def test_max_load_finds_the_largest_passing_concurrency(capacity: int) -> None:
    log: list[float] = []
    result = max_load_search(ObjectiveSpec(max_load=64), capacity_measure(capacity, log))
    assert result.values == [capacity]
    assert len(log) == len(set(log))  # no load measured twice
    assert len(result.points) == len(log)


def test_max_load_is_zero_when_the_lowest_level_misses_and_the_callback_sees_each_point() -> None:
    seen: list[tuple[int, float]] = []
    log: list[float] = []
    result = max_load_search(ObjectiveSpec(min_load=1, max_load=64), capacity_measure(0.5, log),
                             on_point=lambda step, best, point: seen.append((step, best)))
    assert result.values == [0.0] and log == [1] and seen == [(0, 0.0)]


def test_rate_search_stops_within_precision() -> None:
    spec = ObjectiveSpec(load_mode="rate", min_load=0.5, max_load=32, rate_precision=0.05)
    result = max_load_search(spec, capacity_measure(5.3, []))
    assert 5.3 * 0.95 <= result.values[0] <= 5.3


def test_fixed_load_objectives() -> None:
    goodput = evaluate(ObjectiveSpec(kind="goodput", load=4), capacity_measure(3, []))
    assert goodput.values == [3]
    pareto = evaluate(ObjectiveSpec(kind="pareto", load=4), capacity_measure(8, []))
    assert pareto.values == [4, 20.0]
    empty = evaluate(ObjectiveSpec(kind="pareto", load=4), lambda load: {"request_goodput": 0.0, "p90_ttft_ms": None})
    assert empty.values == ObjectiveSpec(kind="pareto").infeasible_values()


def test_repeats_take_the_median_and_report_the_spread() -> None:
    values, spreads = combine_repeats([Evaluation([4.0, 10.0]), Evaluation([6.0, 30.0]), Evaluation([5.0, 20.0])])
    assert values == [5.0, 20.0] and spreads == [2.0, 20.0]


def test_attainment_violation_is_a_soft_constraint() -> None:
    spec = ObjectiveSpec(kind="goodput", attainment=0.9)
    assert attainment_violation(spec, Evaluation([1.0], points=[{"slo_attainment": 0.95}])) == 0.0
    assert attainment_violation(spec, Evaluation([1.0], points=[{"slo_attainment": 0.6}])) == pytest.approx(0.3)
    assert attainment_violation(ObjectiveSpec(), Evaluation([0.0])) > 0


def test_bad_specs_are_rejected() -> None:
    with pytest.raises(ValueError, match="objective must be one of"):
        ObjectiveSpec(kind="throughput")
    with pytest.raises(ValueError, match="attainment"):
        ObjectiveSpec(attainment=1.5)
