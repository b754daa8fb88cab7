"""`--max-load-under-slo --confidence`: Wilson intervals per probe, verdicts, re-measured uncertain probes and
the max load's interval, driven by a fake measure with a known attainment-vs-load curve."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app
from sweep.run.search import (
    Counts,
    SearchConfig,
    answer_text,
    max_load_interval_text,
    max_load_under_slo,
    point_counts,
    wilson_interval,
)


def test_wilson_interval_against_hand_computed_values() -> None:
    # 8 of 10 at 95 % (z = 1.959964): centre (0.8 + z²/20) / (1 + z²/10), half z·sqrt(0.016 + z²/400) / (1 + z²/10)
    assert wilson_interval(8, 10, 0.95) == pytest.approx((0.4902, 0.9433), abs=1e-4)
    assert wilson_interval(95, 100, 0.95) == pytest.approx((0.8883, 0.9785), abs=1e-4)
    assert wilson_interval(0, 10, 0.95) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson_interval(10, 10, 0.90) == pytest.approx((0.7870, 1.0), abs=1e-4)  # z = 1.644854
    assert wilson_interval(0, 0, 0.95) == (0.0, 1.0)
    for bad in (0.0, 1.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="--confidence"):
            wilson_interval(1, 2, bad)
    with pytest.raises(ValueError):
        wilson_interval(3, 2, 0.95)


def curve(capacity: float, n: int, rng: random.Random, calls: list[tuple[float, int]] | None = None):
    """True attainment 0.99 up to `capacity`, falling 0.05 per stream above it; `n` seeded binomial draws."""

    def true_attainment(load: float) -> float:
        return 0.99 if load <= capacity else max(0.0, 0.99 - 0.05 * (load - capacity))

    def measure(load: float, repeat: int) -> Counts:
        if calls is not None:
            calls.append((load, repeat))
        good = sum(rng.random() < true_attainment(load) for _ in range(n))
        return Counts(attainment=good / n, good=good, judged=n)

    return measure


def test_the_interval_contains_the_true_max_load_in_most_seeded_trials() -> None:
    capacity, trials, covered = 12, 200, 0
    true_max = 13  # 0.99 - 0.05 * (load - 12) >= 0.9 up to 13.8 streams
    for seed in range(trials):
        measure = curve(capacity, 50, random.Random(seed))
        config = SearchConfig(mode="concurrency", start=4, max_value=64, confidence=0.95, extra_repeats=2)
        result = max_load_under_slo(config, measure)
        lo, hi = result.max_load_interval
        assert result.best == lo and (lo is None or hi is None or lo < hi)
        assert all(lo is None or u > lo for u in result.uncertain) and all(hi is None or u < hi
                                                                           for u in result.uncertain)
        covered += (lo is None or lo <= true_max) and (hi is None or true_max < hi)
    assert covered >= 0.9 * trials


def test_uncertain_probes_are_remeasured_and_pooled() -> None:
    calls: list[tuple[float, int]] = []
    # every load 0.9 exactly (the goal): 45 of 50 is never a confident pass or fail, so each load gets all 1 + 3
    fixed = {"good": 45, "judged": 50}

    def measure(load: float, repeat: int) -> Counts:
        calls.append((load, repeat))
        return Counts(attainment=0.9, **fixed)

    config = SearchConfig(mode="concurrency", start=2, max_value=2, confidence=0.95, extra_repeats=3)
    result = max_load_under_slo(config, measure)
    assert calls == [(2, 0), (2, 1), (2, 2), (2, 3)]
    (probe,) = result.probes
    assert (probe.good, probe.judged, probe.verdict) == (180, 200, "uncertain")
    assert (probe.ci_low, probe.ci_high) == pytest.approx(wilson_interval(180, 200, 0.95))
    assert result.best is None and result.uncertain == [2] and result.max_load_interval == (None, None)
    assert probe.passed  # pooled attainment 0.9 >= goal: the search treats it as on the passing side

    # a load that is uncertain once but settles when pooled stops being re-measured
    calls.clear()
    draws = iter([Counts(0.85, 17, 20), Counts(1.0, 100, 100), Counts(1.0, 100, 100)])
    def measure(load: float, repeat: int) -> Counts:
        calls.append((load, repeat))
        return next(draws)

    config = SearchConfig(mode="concurrency", start=3, max_value=3, confidence=0.95, extra_repeats=5)
    settled = max_load_under_slo(config, measure)
    assert calls == [(3, 0), (3, 1)] and settled.probes[0].verdict == "pass" and settled.best == 3
    assert (settled.probes[0].good, settled.probes[0].judged) == (117, 120)


def test_repeats_pool_every_probe_and_verdicts_follow_the_rule() -> None:
    calls: list[tuple[float, int]] = []
    measure = curve(8, 40, random.Random(1), calls)
    config = SearchConfig(mode="concurrency", start=8, max_value=8, confidence=0.95, repeats=3)
    result = max_load_under_slo(config, measure)
    assert calls[:3] == [(8, 0), (8, 1), (8, 2)]
    probe = result.probes[0]
    assert probe.judged == 120 and probe.good == sum(m.good for m in probe.measurements)
    assert probe.attainment == pytest.approx(probe.good / 120)
    expected = "pass" if probe.ci_low >= 0.9 else "fail" if probe.ci_high < 0.9 else "uncertain"
    assert probe.verdict == expected


def test_without_confidence_a_point_estimate_decides() -> None:
    result = max_load_under_slo(SearchConfig(mode="concurrency", start=4, max_value=4), lambda *_: Counts(0.9, 9, 10))
    assert result.probes[0].verdict == "pass" and result.best == 4 and result.probes[0].ci_low is None
    confident = max_load_under_slo(SearchConfig(mode="concurrency", start=4, max_value=4, confidence=0.95),
                                   lambda *_: Counts(0.9, 9, 10))
    assert confident.probes[0].verdict == "uncertain" and confident.best is None
    with pytest.raises(ValueError, match="good and judged"):
        max_load_under_slo(SearchConfig(mode="concurrency", start=4, confidence=0.95), lambda *_: Counts(1.0))
    for bad in (0.0, 1.0, 2.0):
        with pytest.raises(ValueError, match="--confidence"):
            SearchConfig(mode="concurrency", start=1, confidence=bad)


def test_a_saturated_measurement_fails_its_probe_and_counts_come_from_the_point() -> None:
    point = {"completed": 40, "failed": 5, "not_sent": 5, "cancelled": 3, "slo_attainment": 0.8}
    assert point_counts(point) == Counts(attainment=0.8, good=40, judged=50)
    saturated = point_counts({**point, "slo_attainment": 1.0, "saturated": True})
    assert saturated.saturated and saturated.attainment == 0.0
    result = max_load_under_slo(SearchConfig(mode="rate", start=2.0, max_value=2.0, min_value=2.0, confidence=0.95),
                                lambda *_: Counts(1.0, 500, 500, saturated=True))
    assert result.probes[0].verdict == "fail" and result.best is None and result.max_load_interval == (None, 2.0)


def test_interval_text() -> None:
    draws = {4: Counts(1.0, 200, 200), 8: Counts(0.9, 180, 200)}  # 8: uncertain, on the passing side
    result = max_load_under_slo(SearchConfig(mode="concurrency", start=4, max_value=16, confidence=0.95),
                                lambda load, _: draws.get(load, Counts(0.5, 100, 200)))
    assert [p.value for p in result.probes] == [4, 8, 16, 12, 10, 9] and result.bracket == (8, 9)
    assert result.best == 4 and result.max_load_interval == (4, 9) and result.uncertain == [8]
    assert max_load_interval_text(result) == "95 % interval 4–9"
    said = answer_text(result, "streams", 6)
    assert "max load under SLO: 4 streams" in said and "95 % interval 4–9; uncertain 8: more prompts" in said
    result.max_load_interval = (4, None)
    assert max_load_interval_text(result) == "95 % interval 4–?"


@pytest.mark.parametrize("value", ["0", "1", "-0.5", "1.5"])
def test_a_bad_confidence_is_a_usage_error_before_anything_is_sent(tmp_path: Path, value: str) -> None:
    out = tmp_path / "run"
    args = ["sweep", "--url", "http://127.0.0.1:9/v1", "--concurrency", "1", "--max-load-under-slo",
            "--slo", "ttft=100", "--confidence", value, "--output-dir", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "--confidence must be in (0, 1)" in result.output, result.output
    assert not out.exists()


@pytest.mark.parametrize("flags", [["--confidence", "0.8"], ["--search-repeats", "2"]])
def test_search_flags_without_the_search_are_a_usage_error(tmp_path: Path, flags: list[str]) -> None:
    out = tmp_path / "run"
    args = ["sweep", "--url", "http://127.0.0.1:9/v1", "--concurrency", "1", "--slo", "ttft=100", *flags,
            "--output-dir", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "add that flag or drop them" in result.output, result.output
    assert not out.exists()
