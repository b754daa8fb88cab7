"""Bracketing + bisection for the largest load whose SLO attainment meets the goal."""

from __future__ import annotations

import pytest

from sweep.run.search import Counts, SearchConfig, max_load_under_slo


def attainment_until(capacity: float):
    calls: list[float] = []

    def measure(load: float, repeat: int) -> Counts:
        calls.append(load)
        return Counts(attainment=1.0 if load <= capacity else 0.5)

    return measure, calls


@pytest.mark.parametrize("start,capacity", [(1, 37), (8, 37), (64, 37), (4, 4), (16, 1)])
def test_concurrency_search_finds_capacity(start: int, capacity: int) -> None:
    measure, calls = attainment_until(capacity)
    result = max_load_under_slo(SearchConfig(mode="concurrency", start=start), measure)
    assert result.best == capacity and result.converged
    assert result.bracket == (capacity, capacity + 1)
    assert all(isinstance(c, int) for c in calls) and len(calls) == len(set(calls))  # no load measured twice
    assert [p.value for p in result.probes] == calls


def test_nothing_passes_and_max_value_cap() -> None:
    measure, calls = attainment_until(0)
    result = max_load_under_slo(SearchConfig(mode="concurrency", start=4), measure)
    assert result.best is None and result.bracket == (None, 1) and calls == [4, 2, 1]
    measure, calls = attainment_until(10**6)
    result = max_load_under_slo(SearchConfig(mode="concurrency", start=3, max_value=20), measure)
    assert result.best == 20 and result.bracket == (20, None) and calls == [3, 6, 12, 20]


def test_rate_search_within_tolerance() -> None:
    measure, _ = attainment_until(7.3)
    result = max_load_under_slo(SearchConfig(mode="rate", start=1.0, rel_tolerance=0.02), measure)
    lo, hi = result.bracket
    assert lo <= 7.3 < hi and (hi - lo) <= 0.02 * lo and result.best == lo


def test_goal_is_inclusive_and_validated() -> None:
    config = SearchConfig(mode="concurrency", start=2, max_value=2, attainment=0.9)
    result = max_load_under_slo(config, lambda *_: Counts(0.9))
    assert result.best == 2
    for bad in ({"attainment": 0.0}, {"attainment": 1.5}, {"start": 0}, {"mode": "tokens"}):
        with pytest.raises(ValueError):
            SearchConfig(**{"mode": "concurrency", "start": 1, **bad})
