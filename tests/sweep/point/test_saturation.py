"""The over-saturation detector on synthetic series: it fires soon above capacity and never below it.

Two simulated servers, fed by Poisson arrivals at `rho` times their capacity and sampled as `SaturationMonitor`
samples a running point (until the last send): a FIFO server with `slots` parallel slots and service times uniform
in service x (1 +- 50 %), and a continuous-batching server whose every step serves all requests in flight (a
request's latency grows with the load, as an LLM engine's does). The measured rates are the module docstring's
(sweep/point/saturation.py) and docs/SWEEP.md's.
"""

from __future__ import annotations

import asyncio
import heapq
import time

import numpy as np
import pytest

from sweep.point.records import RequestRecord
from sweep.point.saturation import (
    SaturationConfig,
    SaturationDetector,
    SaturationMonitor,
    SaturationSample,
    backlog_trend,
    detect,
    is_saturated,
    not_judged_message,
    reference_for,
    saturation_fields,
    saturation_message,
    service_time_p90,
)

TRIALS = 40


def sampled(
    arrivals: np.ndarray, start: np.ndarray, finish: np.ndarray, duration: float, config: SaturationConfig
) -> list[SaturationSample]:
    """The monitor's samples of a simulated point: the first requests' p90 E2EL once they finished (bounded by
    `config.ramp_bound_s` as the monitor bounds it), up to the point's last send."""
    ttft_ms, e2el = (start - arrivals + 0.05) * 1000, finish - arrivals
    first = slice(0, config.ramp_requests)
    ramp_done, ramp_s = finish[first].max(), float(np.percentile(e2el[first], config.ramp_quantile))
    bound, first_offset = config.ramp_bound_s, arrivals[first][-1]
    order = np.argsort(finish)
    samples, previous = [], 0
    for t in np.arange(1, int(duration / config.interval_s) + 1) * config.interval_s:
        done = int(np.searchsorted(finish[order], t, side="right"))
        new = order[previous:done]
        previous = done
        ramp = ramp_s if t >= ramp_done else None
        if bound is not None:
            ramp = min(ramp, bound) if ramp is not None else bound if t >= first_offset + bound else None
        due = int(np.searchsorted(arrivals, t, side="right"))
        ttft = float(np.median(ttft_ms[new])) if new.size else None
        samples.append(SaturationSample(float(t), due, done, ttft, ramp))
        if t >= arrivals[-1]:
            break  # the monitor stops watching at the last send
    return samples


def poisson(rate: float, duration: float, rng: np.random.Generator) -> np.ndarray:
    arrivals = np.cumsum(rng.exponential(1 / rate, int(rate * duration * 1.5) + 20))
    return arrivals[arrivals < duration]


def simulated_samples(
    rho: float, seed: int, duration: float = 60.0, slots: int = 8, service: float = 0.25, config=SaturationConfig()
) -> list[SaturationSample]:
    """A FIFO server: each request takes the slot that frees first and holds it for its service time."""
    rng = np.random.default_rng(seed)
    arrivals = poisson(rho * slots / service, duration, rng)
    service_s = service * (1 + 0.5 * rng.uniform(-1, 1, arrivals.size))
    free, start, finish = [0.0] * slots, np.empty(arrivals.size), np.empty(arrivals.size)
    for i, arrival in enumerate(arrivals):
        start[i] = max(arrival, heapq.heappop(free))
        finish[i] = start[i] + service_s[i]
        heapq.heappush(free, finish[i])
    return sampled(arrivals, start, finish, duration, config)


STEP_S, PER_REQUEST_S, STEPS = 0.029, 0.00625, 64  # capacity 1 / (PER_REQUEST_S x STEPS) = 2.5 req/s


def batching_server(rho: float, duration: float, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Continuous batching: a step serves every request in flight (up to 256) and takes STEP_S + PER_REQUEST_S per
    request; a request needs STEPS +- 30 % steps. Returns arrivals, first-step ends and finishes."""
    arrivals = poisson(rho / (PER_REQUEST_S * STEPS), duration, rng)
    left = np.maximum(1, (STEPS * (1 + 0.3 * rng.uniform(-1, 1, arrivals.size))).astype(int))
    start, finish = np.full(arrivals.size, np.inf), np.full(arrivals.size, np.inf)
    t, arrived, admitted, active = 0.0, 0, 0, []  # requests are admitted in arrival order
    while admitted < arrivals.size or active:
        while arrived < arrivals.size and arrivals[arrived] <= t:
            arrived += 1
        take = min(arrived - admitted, 256 - len(active))
        active += range(admitted, admitted + take)
        admitted += take
        if not active:
            t = float(arrivals[arrived])
            continue
        t += STEP_S + PER_REQUEST_S * len(active)
        for i in active:
            left[i] -= 1
            start[i] = min(start[i], t)
            if left[i] == 0:
                finish[i] = t
        active = [i for i in active if left[i] > 0]
    return arrivals, start, finish


def batching_samples(rho: float, seed: int, duration: float, bounded: bool = True) -> list[SaturationSample]:
    """A point on the batching server; `bounded`: its ramp-up bounded as a sweep bounds it, from the service time
    of a 30 s point at 0.4x capacity judged not saturated."""
    config = SaturationConfig()
    if bounded:
        arrivals, _, finish = batching_server(0.4, 30.0, np.random.default_rng(seed + 1000))
        config = SaturationConfig(reference_service_s=float(np.percentile(finish - arrivals, 90)))
    arrivals, start, finish = batching_server(rho, duration, np.random.default_rng(seed))
    return sampled(arrivals, start, finish, duration, config)


def fired_times(samples: list[list[SaturationSample]]) -> list[float]:
    return [f.at_s for series in samples if (f := detect(series, SaturationConfig())) is not None]


@pytest.mark.parametrize("rho,duration,trials", [(0.5, 60.0, TRIALS), (0.9, 60.0, TRIALS), (0.9, 120.0, 100),
                                                 (0.95, 120.0, 100)])
def test_never_fires_below_capacity(rho: float, duration: float, trials: int) -> None:
    assert fired_times([simulated_samples(rho, seed, duration) for seed in range(trials)]) == []


@pytest.mark.parametrize("rho,duration,within_s", [(1.2, 60.0, 52.5), (1.5, 30.0, 13.0), (2.0, 30.0, 12.0),
                                                   (4.0, 30.0, 12.0)])
def test_fires_above_capacity_within_a_stated_time(rho: float, duration: float, within_s: float) -> None:
    fired = [detect(simulated_samples(rho, seed, duration), SaturationConfig()) for seed in range(TRIALS)]
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
    level; the window only opens after the ramp."""
    assert fired_times([simulated_samples(0.5, seed, 90.0, slots=64, service=5.0) for seed in range(20)]) == []
    overloaded = fired_times([simulated_samples(1.5, seed, 90.0, slots=64, service=5.0) for seed in range(20)])
    assert len(overloaded) == 20 and max(overloaded) <= 29.0


@pytest.mark.parametrize("rho,fired", [(0.5, 0), (0.8, 0), (0.9, 0), (0.95, 4)])
def test_a_batching_server_below_capacity(rho: float, fired: int) -> None:
    """Its in-flight count wanders far (each extra request slows the others), and near capacity its ramp-up to
    the level lasts minutes: the false-positive counts in 100 points of 120 s the docs state."""
    assert len(fired_times([batching_samples(rho, seed, 120.0) for seed in range(100)])) == fired


@pytest.mark.parametrize("rho,within_s", [(1.5, 57.5), (2.0, 33.5), (3.0, 33.5)])
def test_a_batching_server_above_capacity(rho: float, within_s: float) -> None:
    times = fired_times([batching_samples(rho, seed, 60.0) for seed in range(TRIALS)])
    assert len(times) == TRIALS and max(times) <= within_s


def test_the_ramp_bound_is_what_catches_a_batching_server_far_past_capacity() -> None:
    """At 3x its first requests queue from the start: their latency, the unbounded ramp-up, outlasts most 60 s
    points; bounded by the service time of a load below capacity, every point is caught by 33.5 s."""
    unbounded = fired_times([batching_samples(3.0, seed, 60.0, bounded=False) for seed in range(TRIALS)])
    assert len(unbounded) == 2
    assert len(fired_times([batching_samples(1.2, seed, 60.0) for seed in range(TRIALS)])) == 18  # slow growth


def test_the_documented_weak_spot_a_few_requests_a_second() -> None:
    """One slot, 0.5 s service (2 req/s): at 1.5x the backlog grows by 1 request a second, and the deficit
    must exceed 4 sqrt(due + finished): about 80 s past the ramp-up."""
    def fired(rho: float, duration: float = 60.0) -> list[float]:
        return fired_times([simulated_samples(rho, seed, duration, slots=1, service=0.5) for seed in range(20)])

    assert (len(fired(0.5)), len(fired(0.9)), len(fired(1.5))) == (0, 0, 1)
    caught = fired(1.5, 180.0)
    assert len(caught) == 20 and max(caught) <= 162.0


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
    assert saturation_fields({"fired": None, "stopped": False})["saturated"] is False
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


def test_a_point_too_short_to_tell_is_not_judged_rather_than_not_saturated() -> None:
    """Requests of ~8 s at 2x capacity (2 req/s): their ramp-up is long and a 40 s point ends with far fewer
    than the 150 requests due past it that tell a 2x overload from noise, so the point is `saturated: None`,
    never a reassuring False."""
    detector = SaturationDetector(SaturationConfig())
    for sample in simulated_samples(2.0, seed=1, duration=40.0, slots=8, service=8.0):
        detector.observe(sample)
    assert SaturationConfig().due_to_judge == 150
    assert detector.fired is None and not detector.judged and 0 < detector.due_past_ramp < 150
    result = {"fired": None, "stopped": False, "judged": False, "ramp_s": detector.ramp_s,
              "due_past_ramp": detector.due_past_ramp, "due_to_judge": 150, "judge_ratio": 2.0}
    fields = saturation_fields(result)
    assert fields["saturated"] is None and fields["saturation"]["judged"] is False and not is_saturated(fields)
    message = not_judged_message({"label": "r0004.00", **fields})
    assert message and message.startswith("r0004.00: over-saturation not judged") and "--duration" in message
    assert f"{detector.due_past_ramp} requests came due past its ramp-up" in message and "takes 150" in message
    no_ramp = not_judged_message({"label": "r0004.00", "saturated": None, "saturation": {"judged": False}})
    assert no_ramp and "before its first requests had finished" in no_ramp
    judged = SaturationDetector(SaturationConfig())
    for sample in simulated_samples(0.5, seed=1):  # 16 req/s: 150 due in 10 s
        judged.observe(sample)
    assert judged.judged and judged.fired is None
    calm = saturation_fields({"fired": None, "stopped": False, "judged": True, "service_p90_s": 0.3})
    assert calm == {"saturated": False, "saturation": {"judged": True, "service_p90_s": 0.3}}
    assert not_judged_message({"label": "r0001.00", **calm}) is None
    from reports.tables import _saturation_cell

    assert _saturation_cell({"label": "x", **fields}) == "not judged"
    assert _saturation_cell(calm) == "no" and _saturation_cell({"saturated": np.False_}) == "no"


def test_the_monitor_bounds_the_ramp_up_and_stops_at_the_last_send() -> None:
    """The first requests still in flight at the bound (3 x the reference) end the ramp-up there; finished
    first requests slower than the bound are capped by it; the watch returns at the last send."""
    async def run() -> None:
        offsets = [0.01 * i for i in range(30)]
        bounded = SaturationMonitor(SaturationConfig(reference_service_s=1.0), offsets, t0=100.0)
        assert bounded.sample(100.0 + 0.19 + 2.9).ramp_s is None  # the 20th request was due at 0.19 s
        assert bounded.sample(100.0 + 0.19 + 3.01).ramp_s == 3.0
        unbounded = SaturationMonitor(SaturationConfig(), offsets, t0=100.0)
        assert unbounded.sample(200.0).ramp_s is None  # no reference: it waits for the first requests
        for i in range(20):
            unbounded.record_done(RequestRecord(i, 1, 1, 100.0 + offsets[i], send_time=100.0 + offsets[i],
                                                success=True, end_time=105.0 + offsets[i]))
        assert unbounded.ramp_s == pytest.approx(5.0)
        capped = SaturationMonitor(SaturationConfig(reference_service_s=1.0), offsets, t0=100.0)
        for i in range(20):
            capped.record_done(RequestRecord(i, 1, 1, 100.0 + offsets[i], send_time=100.0 + offsets[i],
                                             success=True, end_time=105.0 + offsets[i]))
        assert capped.ramp_s == 3.0
        fast = SaturationConfig(interval_s=0.02, window_s=0.08, min_observe_s=0.0)
        monitor = SaturationMonitor(fast, [0.0, 0.1], t0=time.perf_counter())
        await asyncio.wait_for(monitor.watch(), timeout=2.0)  # returns once the last send (0.1 s) has passed
        assert monitor.detector.samples[-1].t >= 0.1 and len(monitor.detector.samples) <= 8
        assert monitor.result()["send_end_s"] == pytest.approx(0.1)

    asyncio.run(run())


def test_the_reference_is_the_highest_lower_rate_and_its_service_time() -> None:
    assert reference_for({1.0: 4.3, 2.0: 6.3}, 4.0) == 6.3 and reference_for({1.0: 4.3, 2.0: 6.3}, 2.0) == 4.3
    assert reference_for({2.0: 6.3}, 1.0) is None and reference_for({}, 8.0) is None
    assert reference_for({2.0: 6.3}, None) is None and reference_for({2.0: 6.3}, float("inf")) is None
    records = [RequestRecord(i, 1, 1, 0.0, send_time=0.0, success=i < 10, last_token_time=float(i + 1))
               for i in range(12)]
    assert service_time_p90(records) == pytest.approx(float(np.percentile(np.arange(1, 11), 90)))
    assert service_time_p90(records[10:]) is None  # no successful request
    with pytest.raises(ValueError, match="reference_service_s"):
        SaturationConfig(reference_service_s=0.0)
    with pytest.raises(ValueError, match="judge_ratio"):
        SaturationConfig(judge_ratio=1.0)
