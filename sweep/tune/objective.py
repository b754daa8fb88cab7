"""What a trial optimises, computed from measured sweep points (vLLM point fields), and its pruning rule.

Three objectives (see docs: tuning.md §b for the three meanings of "goodput"):
- `max-load` (DistServe's definition): the largest concurrency (or rate) whose `slo_attainment` is at least the
  target, found by bracketing then bisection; maximised.
- `goodput` (vLLM's `request_goodput`): good requests per second at one fixed load; maximised, with
  attainment >= target recorded as a soft constraint.
- `pareto`: (`request_goodput`, `p90_ttft_ms`) at one fixed load; a two-objective study (maximise, minimise).
- `cost`: `cost_per_million_output_tokens` at one fixed load (the price of the devices the configuration occupies
  over the goodput's output tokens, sweep/run/cost.py); minimised, with attainment >= target a soft constraint.

A point the over-saturation detector marked (`saturated`, sweep.point.saturation) fails the attainment target
whatever its measured attainment: the max-load search takes it as attainment 0, and the soft constraint as missed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sweep.point.saturation import is_saturated

OBJECTIVES = ("max-load", "goodput", "pareto", "cost")
REPLAY_MAX_LOAD = (
    "--replay sends the trace at its own timestamps, so --objective max-load has no load to search; tune a replay "
    "with --objective goodput, pareto or cost (at --time-scale S, one value)"
)
NO_COST = 1e12  # USD per million tokens told for a point with no good request (no finite cost)


class Infeasible(RuntimeError):
    """The configuration cannot run: the engine failed to start, ran out of memory, crashed, stopped answering or
    ran past the trial timeout, or its quantization costs more quality than allowed. `cause` names which, in one
    word (INFEASIBLE_CAUSES); `engine_error`, the engine's own error line from its log, when it wrote one."""

    def __init__(self, reason: str, cause: str = "start", engine_error: str | None = None) -> None:
        super().__init__(reason)
        self.cause = cause
        self.engine_error = engine_error


INFEASIBLE_CAUSES = ("constraint", "start", "oom", "crash", "unhealthy", "timeout", "simulation", "quality")


@dataclass
class ObjectiveSpec:
    kind: str = "max-load"
    attainment: float = 0.9
    load_mode: str = "concurrency"  # "concurrency" (closed loop), "rate" (open loop, req/s) or "replay" (a trace)
    load: float = 8  # the fixed load of `goodput`, `pareto` and `cost` (replay: the time scale)
    min_load: float = 1  # the max-load search starts here ...
    max_load: float = 64  # ... and never goes above this
    rate_precision: float = 0.1  # bisection on rates stops when the bracket is narrower than this fraction
    pareto_ttft_metric: str = "p90_ttft_ms"

    def __post_init__(self) -> None:
        if self.kind not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.kind!r}")
        if not 0.0 < self.attainment <= 1.0:
            raise ValueError(f"attainment must be in (0, 1], got {self.attainment}")
        if self.load_mode not in ("concurrency", "rate", "replay"):
            raise ValueError(f"load mode must be 'concurrency', 'rate' or 'replay', got {self.load_mode!r}")
        if self.load_mode == "replay" and self.kind == "max-load":
            raise ValueError(REPLAY_MAX_LOAD)
        if not 0 < self.min_load <= self.max_load:
            raise ValueError(f"need 0 < min_load <= max_load, got {self.min_load}, {self.max_load}")

    @property
    def directions(self) -> list[str]:
        if self.kind == "pareto":
            return ["maximize", "minimize"]
        return ["minimize"] if self.kind == "cost" else ["maximize"]

    @property
    def metric_names(self) -> list[str]:
        return {"max-load": [f"max_{self.load_mode}_under_slo"], "goodput": ["request_goodput"],
                "pareto": ["request_goodput", self.pareto_ttft_metric],
                "cost": ["cost_per_million_output_tokens"]}[self.kind]

    def infeasible_values(self) -> list[float]:
        """The pessimistic values an infeasible trial is told with, so the sampler learns to avoid it."""
        if self.kind == "pareto":
            return [0.0, 1e9]
        return [NO_COST] if self.kind == "cost" else [0.0]

    def passes(self, point: dict[str, Any]) -> bool:
        attained = point_attainment(point)
        return attained is not None and attained >= self.attainment


def point_attainment(point: dict[str, Any]) -> float | None:
    """The point's SLO attainment as the tuner sees it: 0 for a saturated point, None when it has none."""
    if is_saturated(point):
        return 0.0
    attained = point.get("slo_attainment")
    return None if attained is None or math.isnan(attained) else float(attained)


@dataclass
class Evaluation:
    """One measurement of the objective: its values, the points it measured and the search's bracket."""

    values: list[float]
    points: list[dict[str, Any]] = field(default_factory=list)
    bracket: tuple[float, float | None] | None = None  # (largest passing, smallest failing) for max-load


MeasurePoint = Callable[[float], dict[str, Any]]


def max_load_search(
    spec: ObjectiveSpec, measure: MeasurePoint, on_point: Callable[[int, float, dict[str, Any]], None] | None = None
) -> Evaluation:
    """Largest load with attainment >= target, by the sweep's bracketing + bisection from `min_load` upwards.

    `on_point(step, best_passing_load, point)` runs after each point and may raise to stop the search (the tuner
    prunes there).
    """
    from sweep.run.search import Counts, SearchConfig, max_load_under_slo

    points: list[dict[str, Any]] = []
    passing = 0.0

    def attainment(load: float, _repeat: int) -> Counts:
        nonlocal passing
        point = measure(load)
        points.append(point)
        if spec.passes(point):
            passing = max(passing, float(load))
        if on_point is not None:
            on_point(len(points) - 1, passing, point)
        return Counts(attainment=point_attainment(point) or 0.0)

    config = SearchConfig(mode=spec.load_mode, start=spec.min_load, attainment=spec.attainment,
                          max_value=spec.max_load, min_value=spec.min_load, rel_tolerance=spec.rate_precision)
    result = max_load_under_slo(config, attainment)
    best = float(result.best or 0.0)
    return Evaluation(values=[best], points=points, bracket=(best, result.bracket[1]))


def fixed_load_evaluation(spec: ObjectiveSpec, point: dict[str, Any]) -> Evaluation:
    if spec.kind == "cost":
        cost = point.get("cost_per_million_output_tokens")
        if "cost_per_hour" not in point:
            raise ValueError("the cost objective needs points priced with --cost-per-hour")
        return Evaluation(values=[NO_COST if cost is None or math.isnan(cost) else float(cost)], points=[point])
    goodput = float(point.get("request_goodput") or 0.0)
    if spec.kind == "pareto":
        ttft = point.get(spec.pareto_ttft_metric)
        if ttft is None or (isinstance(ttft, float) and math.isnan(ttft)):  # nothing completed
            return Evaluation(values=spec.infeasible_values(), points=[point])
        return Evaluation(values=[goodput, float(ttft)], points=[point])
    return Evaluation(values=[goodput], points=[point])


def evaluate(
    spec: ObjectiveSpec, measure: MeasurePoint, on_point: Callable[[int, float, dict[str, Any]], None] | None = None
) -> Evaluation:
    if spec.kind == "max-load":
        return max_load_search(spec, measure, on_point)
    point = measure(spec.load)
    if on_point is not None:
        on_point(0, spec.load if spec.passes(point) else 0.0, point)
    return fixed_load_evaluation(spec, point)


def combine_repeats(evaluations: list[Evaluation]) -> tuple[list[float], list[float]]:
    """Median of each objective over repeats, and its spread (max - min)."""
    per_objective = list(zip(*(e.values for e in evaluations), strict=True))
    medians = [float(statistics.median(v)) for v in per_objective]
    spreads = [float(max(v) - min(v)) for v in per_objective]
    return medians, spreads


def attainment_violation(spec: ObjectiveSpec, evaluation: Evaluation) -> float:
    """Soft-constraint value (<= 0 feasible): how far the objective's load misses the attainment target."""
    if spec.kind == "max-load":
        return 0.0 if evaluation.values[0] > 0 else spec.attainment
    attained = [point_attainment(p) for p in evaluation.points]
    worst = min((a for a in attained if a is not None), default=0.0)
    return max(0.0, spec.attainment - worst)
