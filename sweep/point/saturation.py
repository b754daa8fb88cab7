"""Over-saturation detection for open-loop (`--request-rate`) points: is the target keeping up with the load?

Past its capacity a server's queue grows for the whole point: every latency then measures how long the point ran,
not the server. While a rate point sends, `SaturationMonitor` samples every `interval_s` (0.5 s):

- `due`: requests whose scheduled send time has passed (sent or still waiting for a `--max-concurrency` slot),
- `finished`: requests that ended (any outcome), so `in_flight = due - finished` (the client's queue included),
- the TTFT of the requests that finished since the last sample,
- `ramp_s`, the ramp-up's length: the `ramp_quantile` (p90) E2EL of the point's first `ramp_requests` (20)
  requests, once they have all finished (their E2EL is the service time before any queue could build up). In a
  sweep it is bounded by `ramp_bound_factor` (3) x `reference_service_s`, the p90 E2EL of the highest lower rate
  not marked saturated: past capacity the first requests already queue (the built-in engine on two CPU cores at
  1.6x capacity: 35 s, against 4.3 s one load below), and the ramp-up is taken to end at the bound once they have
  been in flight that long. The first point of a sweep has no bound.

The rule (`SaturationDetector`), evaluated at each sample over the window from `ramp_s` to now (every sample past
the ramp-up; at least `window_s`, 10 s, long):

1. rate deficit: the completions over the window fall short of the requests that came due over it by more than
   `rate_margin` (10 %): finished < 0.9 x due, and the shortfall (the in-flight count's rise over the window)
   exceeds `noise_z` (4) x sqrt(due + finished), what the difference of two independent Poisson counts of
   those sizes fluctuates by. (A continuous-batching server's in-flight count wanders far more than a Poisson
   count of its mean: each extra request slows every other one; a bound on its mean let such servers fire at
   half their capacity, the arrivals' and completions' own noise does not.)
2. rising backlog: the least-squares slope of `in_flight` over the window's samples is > 0 and its t-statistic
   (slope / its standard error) is at least `min_t_stat` (4): the backlog grows steadily, not by a burst;
3. both hold at `confirm` (3) consecutive samples;
4. not before `min_observe_s` (10 s) into the point, and only while the point sends (a draining point's backlog
   only falls): the window starts after the ramp-up, when completions lag sends by one service time and the
   in-flight count rises to its level, which is neither a deficit nor a trend (until the first requests have
   finished, or the bound has passed, it cannot fire).

Below capacity the completions keep up with the sends (1 fails) and the in-flight count only fluctuates around
its level (2 fails). Above it (offered rate lambda above the capacity mu), completions run at mu and the backlog
grows by lambda - mu each second, so condition 1 holds once the window is about 16 (lambda + mu) / (lambda - mu)^2
seconds long: a few seconds at 2x a fast server's capacity, a minute at 1.5x of 2.5 req/s. The point is then
marked `saturated: true` with `saturated_at_s` (seconds from the point's start) and the evidence
(`saturation`); with `--stop-when-saturated` the point stops there (sweep.point.watch). A point that never fires
is `saturated: false` only once `due_to_judge` (150) requests came due past its ramp-up, enough for a 2x overload
to fire with an 84 % chance; before that it is not judged (`saturated: null`), never a reassuring false.

Measured (tests/sweep/point/test_saturation.py, seeded synthetic trials, Poisson arrivals, sampled as above), on
two servers. A FIFO server with 8 slots and service 0.25 s +- 50 %: never fired below capacity (0/40 at 0.5x and
0.9x in 60 s, 0/100 at 0.9x and 0.95x in 120 s); fired in every trial (40) at 1.5x by 13 s, at 2x and 4x by 12 s
and at 1.2x by 52.5 s; with 5 s requests (64 slots) never at 0.5x, at 1.5x by 29 s. A continuous-batching server
(every step serves all requests in flight and takes 29 ms + 6.25 ms per request, 64 +- 30 % steps a request:
capacity 2.5 req/s, like the built-in engine on two CPU cores with 128 -> 64 tokens), its ramp-up bounded from a
0.4x point as a sweep bounds it, 100 points of 120 s a load below capacity: none fired at 0.5x, 0.8x and 0.9x,
4 at 0.95x (where the ramp-up to the level lasts minutes); 40 of 60 s above: all at 1.5x by 57.5 s, 2x and 3x by
33.5 s, 18 of 40 at 1.2x (without the bound 2 of 40 at 3x: the first requests' latency outlasts the point). A
factor of 2 fired at 0.9x (1/100) and on the built-in engine at 0.8x of its capacity: there the service time
triples between 0.4x and 0.8x (4.5 s to 12.5 s at 128 -> 64 tokens), so a ramp-up cut at twice the lower one
left the point's climb to its level inside the window.
Weak spot: few requests a second. Into a one-slot FIFO server at 2 req/s a 1.5x overload is caught in 1 of 20
points of 60 s and in all 20 of 180 s (by 162 s).

Closed-loop points (`--concurrency`, or an infinite rate) cannot over-saturate in this sense: the client sends only
when a request ends, so the backlog is bounded by the concurrency and the server's slowness shows as latency,
which the SLO judges. The detector is not applied to them, nor to points whose offered rate varies by design (a
ramp-up, a rate curve, a replayed trace) or multi-turn sessions, nor with `--client-procs` > 1 (the requests'
ends are seen in other processes).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields

import numpy as np

from sweep.point.records import RequestRecord

STOPPED_ERROR = "Cancelled: the point stopped at saturation (--stop-when-saturated)"
NOT_SENT_AT_STOP = "NotSent: due before the point stopped at saturation, not sent (--stop-when-saturated)"


@dataclass
class SaturationConfig:
    """The detector's rule constants (see the module docstring) and whether a point that fires stops."""

    stop: bool = False  # --stop-when-saturated: end the point when it fires, and skip the sweep's higher loads
    interval_s: float = 0.5
    window_s: float = 10.0
    min_observe_s: float = 10.0
    rate_margin: float = 0.10
    min_t_stat: float = 4.0
    confirm: int = 3
    ramp_quantile: float = 90.0
    ramp_requests: int = 20
    ramp_bound_factor: float = 3.0  # the ramp-up lasts at most this many reference service times
    noise_z: float = 4.0
    judge_ratio: float = 2.0  # `saturated: false` only once an overload this many x capacity would have fired
    # Per point, set by the sweep (None in config.json): the p90 E2EL of a lower rate not marked saturated.
    reference_service_s: float | None = None

    def __post_init__(self) -> None:
        if not 0 < self.interval_s <= self.window_s:
            raise ValueError(f"need 0 < interval_s <= window_s, got {self.interval_s}, {self.window_s}")
        if self.window_s / self.interval_s < 4:
            raise ValueError("the window must hold at least 4 samples (window_s >= 4 x interval_s)")
        if self.min_observe_s < 0 or not 0 < self.rate_margin < 1 or self.min_t_stat <= 0 or self.confirm < 1:
            raise ValueError(
                "need min_observe_s >= 0, 0 < rate_margin < 1, min_t_stat > 0 and confirm >= 1, got "
                f"{self.min_observe_s}, {self.rate_margin}, {self.min_t_stat}, {self.confirm}"
            )
        if not 0 <= self.ramp_quantile <= 100 or self.ramp_requests < 1:
            raise ValueError(
                f"need ramp_quantile in [0, 100] and ramp_requests >= 1, got {self.ramp_quantile}, {self.ramp_requests}"
            )
        if self.judge_ratio <= 1:
            raise ValueError(f"need judge_ratio > 1, got {self.judge_ratio}")
        if self.ramp_bound_factor <= 0 or (self.reference_service_s is not None and self.reference_service_s <= 0):
            raise ValueError(f"need ramp_bound_factor > 0 and reference_service_s > 0, got {self.ramp_bound_factor}, "
                             f"{self.reference_service_s}")

    @property
    def due_to_judge(self) -> int:
        """Requests due past the ramp-up before a point that never fired is judged not saturated. At judge_ratio
        x capacity the completions are due / r, and the deficit due x (1 - 1/r), whose noise is about
        sqrt(due x (1 + 1/r)), clears noise_z of it with one more to spare (a one-sided 84 % chance to fire)
        from (noise_z + 1)^2 x (1 + 1/r) / (1 - 1/r)^2 due requests on: 150 at 2x."""
        r = self.judge_ratio
        return math.ceil((self.noise_z + 1.0) ** 2 * (1.0 + 1.0 / r) / (1.0 - 1.0 / r) ** 2)

    @property
    def ramp_bound_s(self) -> float | None:
        """The longest ramp-up the detector waits for; None without a reference (the first point of a sweep)."""
        return None if self.reference_service_s is None else self.ramp_bound_factor * self.reference_service_s


@dataclass(frozen=True)
class SaturationSample:
    t: float  # seconds from the point's start (t0)
    due: int  # requests whose send time has passed
    finished: int  # requests that ended, any outcome
    ttft_ms: float | None = None  # median TTFT of the successful requests finished since the previous sample
    ramp_s: float | None = None  # the ramp-up's length; None until the point's first requests have all finished

    @property
    def in_flight(self) -> int:
        return self.due - self.finished


@dataclass(frozen=True)
class Saturation:
    """The evidence at the sample where the detector fired."""

    at_s: float
    offered_rps: float  # due requests / window
    achieved_rps: float  # finished requests / window
    in_flight: int
    in_flight_slope: float  # requests/s, least squares over the window
    t_stat: float
    window_s: float
    ttft_ms_start: float | None  # median TTFT of the window's first and last thirds
    ttft_ms_end: float | None

    def reason(self) -> str:
        text = (
            f"completions {self.achieved_rps:.2f} req/s < offered {self.offered_rps:.2f} req/s over the last "
            f"{self.window_s:.1f} s, in-flight {self.in_flight} rising {self.in_flight_slope:.2f} req/s "
            f"(t = {min(self.t_stat, 999):.0f})"
        )
        if self.ttft_ms_start is not None and self.ttft_ms_end is not None:
            text += f", TTFT p50 {self.ttft_ms_start:.0f} -> {self.ttft_ms_end:.0f} ms"
        return text


def backlog_trend(t: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Least-squares slope of y over t and its t-statistic (inf for an exactly linear rise, 0 for no rise)."""
    t_arr, y_arr = np.asarray(t, dtype=float), np.asarray(y, dtype=float)
    n = t_arr.size
    sxx = float(np.sum((t_arr - t_arr.mean()) ** 2))
    if n < 3 or sxx <= 0:
        return 0.0, 0.0
    slope = float(np.sum((t_arr - t_arr.mean()) * (y_arr - y_arr.mean())) / sxx)
    residuals = y_arr - (y_arr.mean() + slope * (t_arr - t_arr.mean()))
    variance = float(np.sum(residuals**2)) / (n - 2)
    if variance <= 1e-12:
        return slope, math.inf if slope > 0 else 0.0
    return slope, slope / math.sqrt(variance / sxx)


def _median(values: list[float]) -> float | None:
    return float(np.median(values)) if values else None


class SaturationDetector:
    """Feed samples in time order; `observe` returns the evidence once, at the sample where the rule fires."""

    def __init__(self, config: SaturationConfig) -> None:
        self.config = config
        self.samples: list[SaturationSample] = []
        self.streak = 0
        self.fired: Saturation | None = None
        self.judged = False  # enough requests came due past the ramp-up (config.due_to_judge), or it fired
        self.due_past_ramp = 0  # requests due in the last window

    @property
    def ramp_s(self) -> float | None:
        """The last ramp-up length seen (None: its first requests never finished, nor did the bound pass)."""
        return self.samples[-1].ramp_s if self.samples else None

    def observe(self, sample: SaturationSample) -> Saturation | None:
        self.samples.append(sample)
        if self.fired is not None:
            return None
        evidence = self._evaluate()
        self.streak = self.streak + 1 if evidence is not None else 0
        if evidence is not None and self.streak >= self.config.confirm:
            self.fired, self.judged = evidence, True
            return evidence
        return None

    def _evaluate(self) -> Saturation | None:
        cfg, last = self.config, self.samples[-1]
        if last.t < cfg.min_observe_s or last.ramp_s is None:
            return None
        window = [s for s in self.samples if s.t >= last.ramp_s - 1e-9]  # every sample past the ramp-up
        if len(window) < 4 or last.t - window[0].t < cfg.window_s - 1e-9:
            return None
        first = window[0]
        span = last.t - first.t
        due, finished = last.due - first.due, last.finished - first.finished
        self.due_past_ramp = due
        self.judged = self.judged or due >= cfg.due_to_judge
        deficit = due - finished  # = the in-flight count's rise over the window
        if due <= 0 or finished >= (1.0 - cfg.rate_margin) * due:
            return None
        if deficit < cfg.noise_z * math.sqrt(due + finished):
            return None  # within the noise of the arrival and completion counts
        offered, achieved = due / span, finished / span
        slope, t_stat = backlog_trend([s.t for s in window], [s.in_flight for s in window])
        if slope <= 0 or t_stat < cfg.min_t_stat:
            return None
        third = max(1, len(window) // 3)
        return Saturation(
            at_s=last.t,
            offered_rps=offered,
            achieved_rps=achieved,
            in_flight=last.in_flight,
            in_flight_slope=slope,
            t_stat=t_stat,
            window_s=span,
            ttft_ms_start=_median([s.ttft_ms for s in window[:third] if s.ttft_ms is not None]),
            ttft_ms_end=_median([s.ttft_ms for s in window[-third:] if s.ttft_ms is not None]),
        )


def detect(samples: Sequence[SaturationSample], config: SaturationConfig) -> Saturation | None:
    """The rule over a whole series of samples: the evidence where it first fires, or None."""
    detector = SaturationDetector(config)
    for sample in samples:
        if (fired := detector.observe(sample)) is not None:
            return fired
    return None


class SaturationMonitor:
    """Samples one running point for the detector. `record_done` is called with every finished request, `watch`
    runs beside the point's dispatch until its last send; with `config.stop`, `stopped` (a future) is set when
    the detector fires."""

    def __init__(self, config: SaturationConfig, offsets: Sequence[float], t0: float) -> None:
        self.config = config
        self.offsets = np.sort(np.asarray(offsets, dtype=float))
        self.t0 = t0
        self.send_end = float(self.offsets[-1]) if self.offsets.size else 0.0  # the point's last send
        self.detector = SaturationDetector(config)
        self.finished = 0
        self.new_ttfts: list[float] = []
        first = min(config.ramp_requests, self.offsets.size)
        self.first_offset = float(self.offsets[first - 1]) if first else -math.inf  # the first requests' last send
        self.first_count = first
        self.first_e2els: list[float] = []  # how long each of the first requests took (any outcome)
        self.ramp_s: float | None = None
        self.stopped: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def record_done(self, record: RequestRecord) -> None:
        self.finished += 1
        if record.success and record.ttft is not None:
            self.new_ttfts.append(record.ttft * 1000.0)
        if self.ramp_s is None and record.intended_send_time - self.t0 <= self.first_offset + 1e-9:
            self.first_e2els.append((record.end_time or time.perf_counter()) - record.send_time)
            if len(self.first_e2els) >= self.first_count:
                ramp = float(np.percentile(self.first_e2els, self.config.ramp_quantile))
                bound = self.config.ramp_bound_s
                self.ramp_s = ramp if bound is None else min(ramp, bound)

    def sample(self, now: float) -> SaturationSample:
        t = now - self.t0
        bound = self.config.ramp_bound_s
        if self.ramp_s is None and bound is not None and t >= self.first_offset + bound:
            self.ramp_s = bound  # the first requests have been in flight longer than the bound: they queue
        ttfts, self.new_ttfts = self.new_ttfts, []
        due = int(np.searchsorted(self.offsets, t, side="right"))
        return SaturationSample(t, due, self.finished, _median(ttfts), self.ramp_s)

    async def watch(self) -> None:
        """Sample on an absolute grid from t0 until the last send (or until a stopping detector fires): a
        draining point is not judged, its backlog only falls."""
        k = 1
        while True:
            await asyncio.sleep(max(0.0, self.t0 + k * self.config.interval_s - time.perf_counter()))
            k += 1
            sample = self.sample(time.perf_counter())
            if self.detector.observe(sample) is not None:
                if self.config.stop and not self.stopped.done():
                    self.stopped.set_result(None)
                return
            if sample.t >= self.send_end:
                return

    @property
    def fired(self) -> Saturation | None:
        return self.detector.fired

    def result(self) -> dict:
        """The detector's result for `saturation_fields` (the watch's caller adds what stopping did)."""
        return {"fired": self.fired, "stopped": self.stopped.done(), "judged": self.detector.judged,
                "due_past_ramp": self.detector.due_past_ramp, "due_to_judge": self.config.due_to_judge,
                "judge_ratio": self.config.judge_ratio,
                "ramp_s": self.ramp_s, "reference_service_s": self.config.reference_service_s,
                "send_end_s": self.send_end}


def service_time_p90(records: Sequence[RequestRecord]) -> float | None:
    """The p90 E2EL (s) of a point's successful requests: a higher rate's reference service time."""
    e2els = [r.e2el for r in records if r.success and r.e2el is not None]
    return float(np.percentile(e2els, 90)) if e2els else None


def reference_for(service_times: dict[float, float], rate: float | None) -> float | None:
    """The reference service time for a point at `rate`: that of the highest lower rate not marked saturated
    (one not judged is safe too: had it queued, its latency, and so the bound, would only be longer)."""
    if rate is None or not math.isfinite(rate):
        return None
    lower = [r for r in service_times if r < rate]
    return service_times[max(lower)] if lower else None


def applies(mode: str, rate: float, ramp: object, rate_curve: object, turns: int, client_procs: int) -> bool:
    """Whether a point is one the detector judges: constant-rate open loop, one client process, single turns."""
    return (
        mode == "rate" and math.isfinite(rate) and ramp is None and rate_curve is None and turns == 1
        and client_procs == 1
    )


# What a point that never fired keeps of the detector's result: its window's basis and its own service time.
_WINDOW_FIELDS = ("ramp_s", "reference_service_s", "send_end_s", "due_past_ramp", "service_p90_s")


def saturation_fields(result: dict | None) -> dict:
    """The point fields: `saturated`, `saturated_at_s` and the evidence, from the runner's extras entry
    (`{"fired": Saturation | None, "stopped": bool, "judged": bool, ...}`); no fields for a point the detector
    does not apply to, and `saturated: None` (with `saturation.judged = False`) for one that ended before a whole
    window past its ramp-up was seen: not judged is not "not saturated"."""
    if result is None:
        return {}
    fired: Saturation | None = result["fired"]
    if fired is None and not result.get("judged", True):
        kept = {k: result.get(k) for k in (*_WINDOW_FIELDS, "due_to_judge", "judge_ratio")}
        return {"saturated": None, "saturation": {"judged": False, **kept}}
    if fired is None:  # judged, not saturated: what its window rested on, and its service time for higher rates
        kept = {k: result[k] for k in _WINDOW_FIELDS if k in result}
        return {"saturated": False, "saturation": {"judged": True, **kept}}
    evidence = {k: v for k, v in asdict(fired).items() if k != "at_s"}
    evidence.update({k: v for k, v in result.items() if k != "fired"})
    return {"saturated": True, "saturated_at_s": fired.at_s, "saturation": evidence}


def saturation_message(point: dict) -> str:
    """What the console says about a saturated point: when, why, and what stopping it did."""
    evidence = point.get("saturation") or {}
    names = {f.name for f in fields(Saturation)} - {"at_s"}
    reason = Saturation(at_s=point["saturated_at_s"], **{k: v for k, v in evidence.items() if k in names}).reason()
    text = f"{point['label']}: saturated at {point['saturated_at_s']:.1f} s: {reason}"
    if evidence.get("stopped"):
        return (
            f"{text}; stopped there (--stop-when-saturated): {evidence.get('cancelled', 0)} requests in flight "
            f"cancelled, {evidence.get('not_sent', 0)} due but not sent, {evidence.get('not_due', 0)} never due"
        )
    return f"{text}; its latencies measure a growing queue (--stop-when-saturated ends such points early)"


def not_judged_message(point: dict) -> str | None:
    """What the console says about a rate point the detector could not judge (None for any other point)."""
    evidence = point.get("saturation") or {}
    if point.get("saturated") is not None or evidence.get("judged", True):
        return None
    ramp, due, needed = evidence.get("ramp_s"), evidence.get("due_past_ramp"), evidence.get("due_to_judge")
    if ramp is None:
        why = "sending ended before its first requests had finished (their latency is the ramp-up it waits out)"
    else:
        ratio = evidence.get("judge_ratio") or 2.0
        why = (f"{due} requests came due past its ramp-up ({ramp:.1f} s); telling a {ratio:g}x overload from "
               f"noise takes {needed}")
    return f"{point['label']}: over-saturation not judged: {why}; longer points (--duration) let the detector judge"


def saturated_verdict(point: dict) -> bool | None:
    """The detector's verdict on a point, in whatever form the point was read (a dict, a summary.csv cell, a
    DataFrame row): True or False, None where there is none (not watched, not judged, a missing cell: NaN)."""
    value = point.get("saturated")
    if isinstance(value, str):  # a summary.csv cell
        text = value.strip().lower()
        return True if text == "true" else False if text == "false" else None
    return bool(value) if isinstance(value, bool | np.bool_ | int) else None


def is_saturated(point: dict) -> bool:
    """A point the detector marked: it fails the SLO whatever its measured attainment (reports, gate, tuner)."""
    return saturated_verdict(point) is True
