"""`--max-load-under-slo`: the largest concurrency (or request rate) whose SLO attainment stays >= a goal.

DistServe's capacity: attainment = good requests / judged requests (failures and never-sent requests are misses,
client-cancelled ones are left out), goal 0.9 by default. Bracketing from the start value (doubling up while it
passes, halving down while it fails), then bisection until the bracket is one stream wide (concurrency) or
`rel_tolerance` of the passing rate (rate). Attainment is assumed to fall as load rises.

A probe's attainment is a binomial proportion (good out of judged), so with a `confidence` level each probe gets
a Wilson score interval (`wilson_interval`) and a verdict: `pass` when its lower bound >= the goal, `fail` when
its upper bound < the goal, `uncertain` otherwise. A probe starts with `repeats` measurements (`--repeats`) and
an uncertain one is measured again, up to `extra_repeats` more times (`--search-repeats`), pooling good and
judged over its measurements, until its verdict is pass or fail. One still uncertain goes to the side its pooled
attainment is on (>= goal: the bisection continues above it). The answer: `best`, the largest load whose
verdict is pass, and `max_load_interval` = (best, the smallest load above it whose verdict is fail); the true max
load lies in it at about the confidence level. `uncertain` lists the loads still uncertain after their
re-measurements (a search that started above the capacity may have one above the interval's upper end).
A saturated measurement (sweep.point.saturation) fails its probe whatever its counts.
Without a confidence level (`confidence=None`: the tuner and `bench simulate`) a probe passes iff its attainment
>= goal, as a point estimate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from statistics import NormalDist
from typing import Any

from sweep.point.saturation import is_saturated

DEFAULT_CONFIDENCE = 0.95  # `bench sweep --confidence`'s default

VERDICTS = ("pass", "fail", "uncertain")


@dataclass
class SearchConfig:
    mode: str  # "concurrency" | "rate"
    start: float
    attainment: float = 0.9
    max_value: float = 4096.0
    min_value: float | None = None  # default: 1 stream, or start / 64 req/s
    rel_tolerance: float = 0.05  # rate mode: stop when (fail - pass) <= rel_tolerance * pass
    max_probes: int = 16  # loads probed (a load's repeated measurements count once)
    confidence: float | None = None  # e.g. 0.95: Wilson-interval verdicts; None: attainment >= goal
    repeats: int = 1  # measurements every probe starts with, pooled (--repeats)
    extra_repeats: int = 0  # at most this many more measurements of a probe still uncertain (--search-repeats)

    def __post_init__(self) -> None:
        if self.mode not in ("concurrency", "rate"):
            raise ValueError(f"mode must be 'concurrency' or 'rate', got {self.mode!r}")
        if not 0.0 < self.attainment <= 1.0:
            raise ValueError(f"--attainment must be in (0, 1], got {self.attainment}")
        if self.start <= 0:
            raise ValueError(f"the search must start at a positive load, got {self.start}")
        check_confidence(self.confidence)
        if self.repeats < 1 or self.extra_repeats < 0:
            raise ValueError(f"need repeats >= 1 and extra repeats >= 0, got {self.repeats}, {self.extra_repeats}")
        if self.min_value is None:
            self.min_value = 1.0 if self.mode == "concurrency" else self.start / 64
        if self.mode == "concurrency":
            self.start = float(max(1, round(self.start)))


def check_confidence(confidence: float | None) -> None:
    if confidence is not None and not 0.0 < confidence < 1.0:
        raise ValueError(f"--confidence must be in (0, 1), e.g. 0.95, got {confidence}")


def wilson_interval(good: int, judged: int, confidence: float) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion good / judged at a two-sided confidence level;
    (0, 1) when nothing was judged."""
    check_confidence(confidence)
    if not 0 <= good <= judged:
        raise ValueError(f"need 0 <= good <= judged, got {good}, {judged}")
    if judged == 0:
        return 0.0, 1.0
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    n, p = judged, good / judged
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class Counts:
    """One measurement of a load: its attainment and, where known, the good and judged request counts behind it."""

    attainment: float
    good: int | None = None
    judged: int | None = None
    saturated: bool = False


@dataclass(frozen=True)
class Measurement(Counts):
    """A probe's measurement: the counts `measure` returned, and which of the load's measurements it was."""

    repeat: int = 0  # 0: the probe's first measurement; r > 0: its r-th re-measurement (points `<label>-rep<r>`)


@dataclass
class Probe:
    """One load probed: its measurements pooled (good and judged summed) and the verdict on them."""

    value: float
    attainment: float
    verdict: str  # "pass" | "fail" | "uncertain"
    passed: bool  # the side the search put it on: its verdict, or for "uncertain" its attainment >= goal
    good: int | None = None
    judged: int | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    measurements: list[Measurement] = field(default_factory=list)


@dataclass
class SearchResult:
    mode: str
    goal: float
    best: float | None  # the largest load whose verdict is pass; None if none passed
    bracket: tuple[float | None, float | None]  # the bisection's (largest passing side, smallest failing side)
    probes: list[Probe] = field(default_factory=list)
    converged: bool = False
    confidence: float | None = None
    # (best, the smallest load above it whose verdict is fail); None at an end with no such load
    max_load_interval: tuple[float | None, float | None] = (None, None)
    uncertain: list[float] = field(default_factory=list)  # loads still uncertain after their re-measurements

    def to_dict(self) -> dict:
        return asdict(self)


def judge(probe: Probe, goal: float, confidence: float | None) -> None:
    """Pool the probe's measurements and set its attainment, interval and verdict."""
    ms = probe.measurements
    counted = all(m.good is not None and m.judged is not None for m in ms)
    if counted:
        probe.good = sum(m.good or 0 for m in ms)
        probe.judged = sum(m.judged or 0 for m in ms)
    if counted and probe.judged:
        probe.attainment = (probe.good or 0) / probe.judged
    else:
        probe.attainment = sum(m.attainment for m in ms) / len(ms)
    if any(m.saturated for m in ms):
        probe.attainment = 0.0
        probe.verdict = "fail"
    elif confidence is None:
        probe.verdict = "pass" if probe.attainment >= goal else "fail"
    else:
        if not counted:
            raise ValueError("a search with a confidence level needs each point's good and judged request counts")
        probe.ci_low, probe.ci_high = wilson_interval(probe.good or 0, probe.judged or 0, confidence)
        probe.verdict = "pass" if probe.ci_low >= goal else "fail" if probe.ci_high < goal else "uncertain"
    probe.passed = probe.verdict == "pass" or (probe.verdict == "uncertain" and probe.attainment >= goal)


def max_load_under_slo(config: SearchConfig, measure: Callable[[float, int], Counts]) -> SearchResult:
    """`measure(load, repeat)` runs one point (repeat 0 first, then 1, 2, ... for the same load) and returns its
    counts."""
    integer = config.mode == "concurrency"
    probes: dict[float, Probe] = {}

    def one(value: float, repeat: int) -> Measurement:
        counts = measure(int(value) if integer else value, repeat)
        return Measurement(**asdict(counts), repeat=repeat)

    def passes(value: float) -> bool:
        if value not in probes:
            probe = Probe(value=value, attainment=0.0, verdict="uncertain", passed=False)
            probe.measurements = [one(value, r) for r in range(config.repeats)]
            judge(probe, config.attainment, config.confidence)
            while probe.verdict == "uncertain" and len(probe.measurements) < config.repeats + config.extra_repeats:
                probe.measurements.append(one(value, len(probe.measurements)))
                judge(probe, config.attainment, config.confidence)
            probes[value] = probe
        return probes[value].passed

    def narrow(lo: float, hi: float) -> bool:
        gap = hi - lo
        return gap <= 1 if integer else gap <= config.rel_tolerance * lo

    lo: float | None = None  # largest passing side
    hi: float | None = None  # smallest failing side
    value = config.start
    assert config.min_value is not None
    while len(probes) < config.max_probes:
        if passes(value):
            lo = value
            if hi is not None or value >= config.max_value:
                break
            value = min(value * 2, config.max_value)
        else:
            hi = value
            if lo is not None or value <= config.min_value:
                break
            value = max(float(int(value // 2)) if integer else value / 2, config.min_value)
    while lo is not None and hi is not None and not narrow(lo, hi) and len(probes) < config.max_probes:
        mid = float((int(lo) + int(hi)) // 2) if integer else (lo + hi) / 2
        if passes(mid):
            lo = mid
        else:
            hi = mid
    converged = lo is not None and (hi is None and lo >= config.max_value or hi is not None and narrow(lo, hi))
    converged = converged or (lo is None and hi is not None and hi <= config.min_value)
    probed = list(probes.values())
    best = max((p.value for p in probed if p.verdict == "pass"), default=None)
    failing = [p.value for p in probed if p.verdict == "fail" and (best is None or p.value > best)]
    return SearchResult(
        mode=config.mode,
        goal=config.attainment,
        best=best,
        bracket=(lo, hi),
        probes=probed,
        converged=converged,
        confidence=config.confidence,
        max_load_interval=(best, min(failing, default=None)),
        uncertain=sorted(p.value for p in probed if p.verdict == "uncertain"),
    )


def point_counts(point: dict[str, Any]) -> Counts:
    """The search's view of a point: its SLO attainment and good / judged request counts (judged = completed +
    failed + not_sent, cancelled requests being neither; good = attainment x judged); saturated when the
    over-saturation detector marked it (its latencies measure a queue)."""
    judged = int(point.get("completed") or 0) + int(point.get("failed") or 0) + int(point.get("not_sent") or 0)
    attainment = point.get("slo_attainment")
    attainment = 0.0 if attainment is None or math.isnan(attainment) else float(attainment)
    good = round(attainment * judged)
    if is_saturated(point):
        return Counts(attainment=0.0, good=good, judged=judged, saturated=True)
    return Counts(attainment=attainment, good=good, judged=judged)


def max_load_interval_text(result: SearchResult) -> str:
    """The answer's interval for the console, e.g. "95 % interval 8–12" ("?" for an end no probe settled)."""
    lo, hi = result.max_load_interval
    ends = "–".join("?" if v is None else f"{v:g}" for v in (lo, hi))
    if result.confidence is None:
        return f"interval {ends}"
    return f"{result.confidence * 100:g} % interval {ends}"


def answer_text(result: SearchResult, unit: str, points: int) -> str:
    """The console's answer line (rich markup): the max load, its interval, the loads left uncertain, the bracket
    and the points run."""
    interval = max_load_interval_text(result)
    if result.uncertain:  # a load more requests would settle
        interval += f"; uncertain {', '.join(f'{v:g}' for v in result.uncertain)}: more prompts or --search-repeats"
    if result.best is None:
        level = "" if result.confidence is None else f" with {result.confidence * 100:g} % confidence"
        return f"[red]no load met attainment >= {result.goal}{level}[/red] ({interval}; {points} points)"
    return (f"[green]max load under SLO: {result.best:g} {unit}[/green] ({interval}; bracket {result.bracket}, "
            f"{points} points)")


def search_record(result: SearchResult, label: Callable[[float], str]) -> dict[str, Any]:
    """search.json's content: the result, each probe's point labels (`label(load)`, then `<label>-rep<r>`) and
    `labels`, every point in the order measured."""
    record = result.to_dict()
    for probe in record["probes"]:
        probe["labels"] = [label(probe["value"]) + (f"-rep{m['repeat']}" if m["repeat"] else "")
                           for m in probe["measurements"]]
    record["labels"] = [name for probe in record["probes"] for name in probe["labels"]]
    return record
