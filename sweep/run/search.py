"""`--max-load-under-slo`: the largest concurrency (or request rate) whose SLO attainment stays >= a goal.

DistServe's capacity: attainment = good requests / all requests (failures are misses), goal 0.9 by default.
Bracketing from the start value (doubling up while it passes, halving down while it fails), then bisection
until the bracket is one stream wide (concurrency) or `rel_tolerance` of the passing rate (rate).
Attainment is assumed to fall as load rises; a noisy non-monotone probe just narrows the bracket on its side.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from sweep.point.saturation import is_saturated


@dataclass
class SearchConfig:
    mode: str  # "concurrency" | "rate"
    start: float
    attainment: float = 0.9
    max_value: float = 4096.0
    min_value: float | None = None  # default: 1 stream, or start / 64 req/s
    rel_tolerance: float = 0.05  # rate mode: stop when (fail - pass) <= rel_tolerance * pass
    max_probes: int = 16

    def __post_init__(self) -> None:
        if self.mode not in ("concurrency", "rate"):
            raise ValueError(f"mode must be 'concurrency' or 'rate', got {self.mode!r}")
        if not 0.0 < self.attainment <= 1.0:
            raise ValueError(f"--attainment must be in (0, 1], got {self.attainment}")
        if self.start <= 0:
            raise ValueError(f"the search must start at a positive load, got {self.start}")
        if self.min_value is None:
            self.min_value = 1.0 if self.mode == "concurrency" else self.start / 64
        if self.mode == "concurrency":
            self.start = float(max(1, round(self.start)))


@dataclass
class Probe:
    value: float
    attainment: float
    passed: bool
    repeat: int = 0  # 0: the search's own probe; r > 0: a repeat near the boundary (`confirm_boundary`)


@dataclass
class SearchResult:
    mode: str
    goal: float
    best: float | None  # the largest load that met the goal; None if even the smallest failed
    bracket: tuple[float | None, float | None]  # (largest passing, smallest failing)
    probes: list[Probe] = field(default_factory=list)
    converged: bool = False
    # with repeats: (largest load that passed every measurement, smallest that failed every one); loads with
    # mixed results lie inside and are listed in `uncertain`
    interval: tuple[float | None, float | None] | None = None
    uncertain: list[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def max_load_under_slo(config: SearchConfig, measure: Callable[[float], float]) -> SearchResult:
    """`measure(load)` runs one point and returns its SLO attainment in [0, 1]."""
    integer = config.mode == "concurrency"
    probes: list[Probe] = []
    cache: dict[float, bool] = {}

    def passes(value: float) -> bool:
        if value not in cache:
            attainment = measure(int(value) if integer else value)
            cache[value] = attainment >= config.attainment
            probes.append(Probe(value=value, attainment=attainment, passed=cache[value]))
        return cache[value]

    def narrow(lo: float, hi: float) -> bool:
        gap = hi - lo
        return gap <= 1 if integer else gap <= config.rel_tolerance * lo

    lo: float | None = None  # largest passing
    hi: float | None = None  # smallest failing
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
    return SearchResult(
        mode=config.mode, goal=config.attainment, best=lo, bracket=(lo, hi), probes=probes, converged=converged
    )


def confirm_boundary(result: SearchResult, repeats: int, measure: Callable[[float, int], float]) -> SearchResult:
    """Measure the bracket's two loads `repeats` more times each (`measure(load, repeat)`), then report the max load
    with an interval: the largest load that passed every one of its measurements (`best`), and the smallest that
    failed every one. A load with mixed results is `uncertain` and lies inside the interval; when the passing end
    of the bracket turns out uncertain, `best` falls back to the largest load below it that always passed."""
    if repeats < 1 or result.best is None and result.bracket[1] is None:
        return result
    for value in [v for v in result.bracket if v is not None]:
        for r in range(1, repeats + 1):
            attainment = measure(value, r)
            result.probes.append(Probe(value=value, attainment=attainment, passed=attainment >= result.goal, repeat=r))
    outcomes: dict[float, list[bool]] = {}
    for probe in result.probes:
        outcomes.setdefault(probe.value, []).append(probe.passed)
    always_pass = [v for v, o in outcomes.items() if all(o)]
    always_fail = [v for v, o in outcomes.items() if not any(o)]
    result.uncertain = sorted(v for v, o in outcomes.items() if any(o) and not all(o))
    result.best = max(always_pass, default=None)
    result.interval = (
        result.best,
        min((v for v in always_fail if result.best is None or v > result.best), default=None),
    )
    return result


def search_attainment(point: dict[str, Any]) -> float:
    """The search's view of a point: its SLO attainment, 0 when it saturated (its latencies measure a queue)."""
    return 0.0 if is_saturated(point) else float(point["slo_attainment"] or 0.0)
