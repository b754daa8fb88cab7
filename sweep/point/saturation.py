"""Over-saturation detection for open-loop (`--request-rate`) points: is the target keeping up with the load?

Past its capacity a server's queue grows for the whole point: every latency then measures how long the point ran,
not the server. While a rate point runs, `SaturationMonitor` samples every `interval_s` (0.5 s):

- `due`: requests whose scheduled send time has passed (sent or still waiting for a `--max-concurrency` slot),
- `finished`: requests that ended (any outcome), so `in_flight = due - finished` (the client's queue included),
- the TTFT of the requests that finished since the last sample,
- `ramp_s`, the ramp-up's length: the `ramp_quantile` (p90) E2EL of the point's first `ramp_requests` (20)
  requests, once they have all finished (their E2EL is the service time before any queue could build up).

The rule (`SaturationDetector`), evaluated at each sample over the last `window_s` seconds (10 s), or over
`ramp_windows` (4) x `ramp_s` when that is longer (a stable queue's in-flight count wanders on the time scale of
its service time, so the window spans several):

1. rate deficit: the completion rate over the window is below the rate the client offered over it (due
   requests / window) by more than `rate_margin` (10 %): finished < 0.9 x due, and the shortfall (the in-flight
   count's rise over the window) exceeds `noise_z` (4) x sqrt(2 x in-flight at the window's start, at most the due
   count), what a stable queue's count fluctuates by (its variance is about its mean, as a Poisson count's);
2. rising backlog: the least-squares slope of `in_flight` over the window's samples is > 0 and its t-statistic
   (slope / its standard error) is at least `min_t_stat` (4): the backlog grows steadily, not by a burst;
3. both hold at `confirm` (3) consecutive samples;
4. not before `min_observe_s` (10 s) into the point, and only when the window starts after `ramp_s`: while a
   point ramps up from empty, completions lag sends by one service time and the in-flight count rises to its
   level, which is neither a deficit nor a trend (condition 4 keeps the detector from reading that ramp as
   saturation, however long the target's requests take; until the first requests have finished it cannot fire).

Below capacity the completions catch up with the sends after the ramp (1 fails) and the in-flight count only
fluctuates around its level (2 fails). Above it (offered rate x capacity ratio rho > 1), completions run at the
capacity, 1 - 1/rho below the offer (a third at 1.5x), and the backlog grows by (rho - 1) x capacity each second.
The point is then marked `saturated: true` with `saturated_at_s` (seconds from the point's start) and the
evidence (`saturation`); with `--stop-when-saturated` the point stops there (sweep.point.watch).

Measured (tests/sweep/point/test_saturation.py, 40 seeded synthetic trials each: Poisson arrivals into a FIFO
server with 8 slots, service 0.25 s +- 50 %, sampled as above): at 0.5x and 0.9x capacity the detector never fired
in 60 s (false-positive rate 0/40 each); at 1.5x, 2x and 4x it fired in every trial, by 12 s (10 s of minimum
observation plus 3 confirming samples); at 1.2x in every trial, by 21 s. With 5 s requests (64 slots, 20 trials)
it never fired at 0.5x and fired at 1.5x by 40 s (the window stretches to four service times). Weak spot: a few
requests per window (1 slot, 0.5 s service, 1-3 req/s): 15 of 20 trials caught a 1.5x overload within 60 s, and
at 0.9x, where a one-slot queue wanders far, 5 of 20 fired (none at 0.5x).

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
    ramp_windows: float = 4.0  # the window spans at least this many ramp-ups (service times)
    noise_z: float = 4.0

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
        self.judged = False  # a whole window past the ramp-up was seen: a point that never fired was judged
        self.window_needed_s: float | None = None  # the last window length the rule asked for

    def observe(self, sample: SaturationSample) -> Saturation | None:
        self.samples.append(sample)
        if self.fired is not None:
            return None
        evidence = self._evaluate()
        self.streak = self.streak + 1 if evidence is not None else 0
        if evidence is not None and self.streak >= self.config.confirm:
            self.fired = evidence
            return evidence
        return None

    def _evaluate(self) -> Saturation | None:
        cfg, last = self.config, self.samples[-1]
        if last.t < cfg.min_observe_s or last.ramp_s is None:
            return None
        length = max(cfg.window_s, cfg.ramp_windows * last.ramp_s)
        self.window_needed_s = length
        window = [s for s in self.samples if s.t >= last.t - length - 1e-9]
        first = window[0]
        span = last.t - first.t
        if len(window) < 4 or span < 0.5 * length or first.t < last.ramp_s:
            return None  # too few samples, or the window still holds the ramp-up
        self.judged = True
        due, finished = last.due - first.due, last.finished - first.finished
        deficit = due - finished  # = the in-flight count's rise over the window
        if due <= 0 or finished >= (1.0 - cfg.rate_margin) * due:
            return None
        if deficit < cfg.noise_z * math.sqrt(2.0 * max(1, min(first.in_flight, due))):
            return None  # within what a stable queue's in-flight count fluctuates by over the window
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
    runs beside the point's dispatch; with `config.stop`, `stopped` (a future) is set when the detector fires."""

    def __init__(self, config: SaturationConfig, offsets: Sequence[float], t0: float) -> None:
        self.config = config
        self.offsets = np.sort(np.asarray(offsets, dtype=float))
        self.t0 = t0
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
                self.ramp_s = float(np.percentile(self.first_e2els, self.config.ramp_quantile))

    def sample(self, now: float) -> SaturationSample:
        t = now - self.t0
        ttfts, self.new_ttfts = self.new_ttfts, []
        due = int(np.searchsorted(self.offsets, t, side="right"))
        return SaturationSample(t, due, self.finished, _median(ttfts), self.ramp_s)

    async def watch(self) -> None:
        """Sample on an absolute grid from t0 until cancelled (or until a stopping detector fires)."""
        k = 1
        while True:
            await asyncio.sleep(max(0.0, self.t0 + k * self.config.interval_s - time.perf_counter()))
            k += 1
            if self.detector.observe(self.sample(time.perf_counter())) is not None:
                if self.config.stop and not self.stopped.done():
                    self.stopped.set_result(None)
                return

    @property
    def fired(self) -> Saturation | None:
        return self.detector.fired


def applies(mode: str, rate: float, ramp: object, rate_curve: object, turns: int, client_procs: int) -> bool:
    """Whether a point is one the detector judges: constant-rate open loop, one client process, single turns."""
    return (
        mode == "rate" and math.isfinite(rate) and ramp is None and rate_curve is None and turns == 1
        and client_procs == 1
    )


def saturation_fields(result: dict | None) -> dict:
    """The point fields: `saturated`, `saturated_at_s` and the evidence, from the runner's extras entry
    (`{"fired": Saturation | None, "stopped": bool, "judged": bool, ...}`); no fields for a point the detector
    does not apply to, and `saturated: None` (with `saturation.judged = False`) for one that ended before a whole
    window past its ramp-up was seen: not judged is not "not saturated"."""
    if result is None:
        return {}
    fired: Saturation | None = result["fired"]
    if fired is None and not result.get("judged", True):
        return {"saturated": None, "saturation": {"judged": False, "window_needed_s": result.get("window_needed_s")}}
    if fired is None:
        return {"saturated": False}
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
    needed = evidence.get("window_needed_s")
    window = f"its window of {needed:.0f} s (4 x the first requests' latency) " if needed else "its window "
    return (f"{point['label']}: over-saturation not judged: the point ended before {window}past the ramp-up "
            "closed; longer points (--duration) let the detector judge")


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
