"""The over-saturation detector on synthetic series: it fires soon above capacity and never below it.

Each trial simulates a FIFO server with `slots` parallel slots and service times uniform in service x (1 +- 50 %),
fed by Poisson arrivals at `rho` times its capacity (slots / service), sampled as `SaturationMonitor` samples a
running point. The measured rates are the module docstring's (sweep/point/saturation.py) and docs/SWEEP.md's.
"""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from sweep.point.saturation import (
    SaturationConfig,
    SaturationDetector,
    SaturationSample,
    backlog_trend,
    detect,
    is_saturated,
    not_judged_message,
    saturation_fields,
    saturation_message,
)

TRIALS = 40


def simulated_samples(
    rho: float, seed: int, duration: float = 60.0, slots: int = 8, service: float = 0.25, config=SaturationConfig()
) -> list[SaturationSample]:
    rng = np.random.default_rng(seed)
    rate = rho * slots / service
    arrivals = np.cumsum(rng.exponential(1 / rate, int(rate * duration * 1.3) + 20))
    arrivals = arrivals[arrivals < duration]
    service_s = service * (1 + 0.5 * rng.uniform(-1, 1, arrivals.size))
    free, start, finish = [0.0] * slots, np.empty(arrivals.size), np.empty(arrivals.size)
    for i, arrival in enumerate(arrivals):  # FIFO: each request takes the slot that frees first
        start[i] = max(arrival, heapq.heappop(free))
        finish[i] = start[i] + service_s[i]
        heapq.heappush(free, finish[i])
    ttft_ms, e2el = (start - arrivals + 0.05) * 1000, finish - arrivals
    first = slice(0, config.ramp_requests)
    ramp_done, ramp_s = finish[first].max(), float(np.percentile(e2el[first], config.ramp_quantile))
    order = np.argsort(finish)
    samples, previous = [], 0
    for t in np.arange(1, int(duration / config.interval_s) + 1) * config.interval_s:
        done = int(np.searchsorted(finish[order], t, side="right"))
        new = order[previous:done]
        previous = done
        samples.append(SaturationSample(
            t=float(t), due=int(np.searchsorted(arrivals, t, side="right")), finished=done,
            ttft_ms=float(np.median(ttft_ms[new])) if new.size else None, ramp_s=ramp_s if t >= ramp_done else None,
        ))
    return samples


@pytest.mark.parametrize("rho", [0.5, 0.9])
def test_never_fires_below_capacity(rho: float) -> None:
    fired = [f.at_s for seed in range(TRIALS) if (f := detect(simulated_samples(rho, seed), SaturationConfig()))]
    assert fired == []  # false-positive rate 0 / 40 over 60 s points


@pytest.mark.parametrize("rho,within_s", [(1.2, 21.0), (1.5, 12.5), (2.0, 12.5), (4.0, 12.5)])
def test_fires_above_capacity_within_a_stated_time(rho: float, within_s: float) -> None:
    fired = [detect(simulated_samples(rho, seed, duration=30.0), SaturationConfig()) for seed in range(TRIALS)]
    times = [f.at_s for f in fired if f is not None]
    assert len(times) == TRIALS and max(times) <= within_s
    assert min(times) >= SaturationConfig().min_observe_s
    evidence = fired[0]
    capacity = 8 / 0.25
    assert evidence.achieved_rps == pytest.approx(capacity, rel=0.15)  # completions run at the capacity
    assert evidence.offered_rps == pytest.approx(rho * capacity, rel=0.15)
    assert evidence.in_flight_slope == pytest.approx((rho - 1) * capacity, rel=0.5)  # the backlog grows
    assert evidence.ttft_ms_end > evidence.ttft_ms_start  # the queue shows in TTFT


def test_a_long_ramp_up_is_not_saturation() -> None:
    """Service of 5 s: for the first seconds completions lag sends and the in-flight count rises towards its
    level; the window only opens after the ramp and spans four service times."""
    config = SaturationConfig()
    stable = [detect(simulated_samples(0.5, seed, 90.0, slots=64, service=5.0), config) for seed in range(20)]
    assert stable == [None] * 20
    overloaded = [detect(simulated_samples(1.5, seed, 90.0, slots=64, service=5.0), config) for seed in range(20)]
    assert all(f is not None and f.at_s <= 40.0 for f in overloaded)


def test_the_documented_weak_spot_a_few_requests_per_window() -> None:
    """One slot, 0.5 s service (2 req/s): the counts the module docstring and docs/SWEEP.md state."""
    def fired(rho: float) -> int:
        return sum(detect(simulated_samples(rho, seed, slots=1, service=0.5), SaturationConfig()) is not None
                   for seed in range(20))

    assert (fired(0.5), fired(0.9), fired(1.5)) == (0, 5, 15)


def test_each_condition_is_needed() -> None:
    overloaded = simulated_samples(2.0, seed=1)
    assert detect(overloaded, SaturationConfig(rate_margin=0.6)) is None  # completions at half the offer: not 60 %
    assert detect(overloaded, SaturationConfig(min_t_stat=1e9)) is None  # no trend is significant enough
    no_ramp = [SaturationSample(s.t, s.due, s.finished, s.ttft_ms, None) for s in overloaded]
    assert detect(no_ramp, SaturationConfig()) is None  # the first requests never finished: no ramp-up estimate
    late = detect(overloaded, SaturationConfig(min_observe_s=30.0))
    assert late is not None and late.at_s >= 30.0


def test_backlog_trend() -> None:
    t = np.arange(20) * 0.5
    assert backlog_trend(t, 3 * t + 2) == (pytest.approx(3.0), np.inf)
    slope, t_stat = backlog_trend(t, np.full(20, 7.0))
    assert slope == 0.0 and t_stat == 0.0
    noisy = np.random.default_rng(0).normal(10, 2, 20)
    assert abs(backlog_trend(t, noisy)[1]) < 4


def test_config_checks() -> None:
    for bad in ({"interval_s": 0}, {"window_s": 1.0}, {"rate_margin": 1.0}, {"confirm": 0}, {"ramp_requests": 0}):
        with pytest.raises(ValueError):
            SaturationConfig(**bad)


def test_point_fields_and_the_verdict_everywhere_reads() -> None:
    fired = detect(simulated_samples(2.0, seed=3), SaturationConfig())
    assert saturation_fields(None) == {}  # a point the detector does not judge (closed loop) has no fields
    assert saturation_fields({"fired": None, "stopped": False}) == {"saturated": False}
    fields = saturation_fields({"fired": fired, "stopped": True, "cancelled": 5, "not_sent": 0, "not_due": 40})
    assert fields["saturated"] is True and fields["saturated_at_s"] == fired.at_s
    assert fields["saturation"]["cancelled"] == 5 and fields["saturation"]["offered_rps"] == fired.offered_rps
    message = saturation_message({"label": "r0064.00", **fields})
    assert message.startswith(f"r0064.00: saturated at {fired.at_s:.1f} s: completions")
    assert "5 requests in flight cancelled" in message and "40 never due" in message
    assert is_saturated(fields) and is_saturated({"saturated": np.True_}) and is_saturated({"saturated": "True"})
    assert not is_saturated({"saturated": float("nan")}) and not is_saturated({}) and not is_saturated(
        {"saturated": False}
    )


def test_a_point_shorter_than_the_detectors_window_is_not_judged_rather_than_not_saturated() -> None:
    """Requests of ~8 s make the window 4 x their p90 latency: a 40 s point at 2x capacity ends before it closes
    (as measured on smollm2-135m with LMSYS at 4 req/s), so the point is `saturated: None`, never a reassuring
    False."""
    detector = SaturationDetector(SaturationConfig())
    for sample in simulated_samples(2.0, seed=1, duration=40.0, slots=8, service=8.0):
        detector.observe(sample)
    assert detector.fired is None and not detector.judged and detector.window_needed_s > 40.0
    result = {"fired": None, "stopped": False, "judged": False, "window_needed_s": detector.window_needed_s}
    fields = saturation_fields(result)
    assert fields["saturated"] is None and fields["saturation"]["judged"] is False and not is_saturated(fields)
    message = not_judged_message({"label": "r0004.00", **fields})
    assert message and message.startswith("r0004.00: over-saturation not judged") and "--duration" in message
    judged = SaturationDetector(SaturationConfig())
    for sample in simulated_samples(0.5, seed=1):
        judged.observe(sample)
    assert judged.judged and judged.fired is None
    assert saturation_fields({"fired": None, "stopped": False, "judged": True}) == {"saturated": False}
    assert not_judged_message({"label": "r0001.00", "saturated": False}) is None
    from reports.tables import _saturation_cell

    assert _saturation_cell({"label": "x", **fields}) == "not judged"
    assert _saturation_cell({"saturated": False}) == "no" and _saturation_cell({"saturated": np.False_}) == "no"
