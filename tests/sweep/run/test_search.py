"""Bracketing + bisection for the largest load whose SLO attainment meets the goal."""

from __future__ import annotations

import pytest

from sweep.run.search import SearchConfig, max_load_under_slo


def attainment_until(capacity: float):
    calls: list[float] = []

    def measure(load: float) -> float:
        calls.append(load)
        return 1.0 if load <= capacity else 0.5

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
    result = max_load_under_slo(SearchConfig(mode="concurrency", start=2, max_value=2, attainment=0.9), lambda _: 0.9)
    assert result.best == 2
    for bad in ({"attainment": 0.0}, {"attainment": 1.5}, {"start": 0}, {"mode": "tokens"}):
        with pytest.raises(ValueError):
            SearchConfig(**{"mode": "concurrency", "start": 1, **bad})


def test_repeats_near_the_boundary_give_an_interval() -> None:
    from sweep.run.search import confirm_boundary

    # capacity 8 streams, but load 8 is noisy: its repeats fail once; 9 fails every time
    noisy = {(8, 1): 0.85}

    def measure(value: float) -> float:
        return 0.95 if value <= 8 else 0.5

    def again(value: float, repeat: int) -> float:
        return noisy.get((int(value), repeat), measure(value))

    result = max_load_under_slo(SearchConfig(mode="concurrency", start=2), measure)
    assert result.best == 8 and result.bracket == (8, 9)
    result = confirm_boundary(result, 2, again)
    assert [(p.value, p.repeat) for p in result.probes if p.repeat] == [(8, 1), (8, 2), (9, 1), (9, 2)]
    assert result.uncertain == [8] and result.best == 4 and result.interval == (4, 9)  # 8 passed 2 of 3
    clean = confirm_boundary(max_load_under_slo(SearchConfig(mode="concurrency", start=2), measure), 2,
                             lambda v, r: measure(v))
    assert clean.best == 8 and clean.interval == (8, 9) and clean.uncertain == []
