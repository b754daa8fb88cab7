"""Tuner efficiency on a measured grid: replay a recorded full grid as the objective, count trials to near-best.

`export_grid` turns a finished `bench tune --grid` study into a JSON fixture (every combination's value and
feasibility). `trials_to_reach` replays it: a sampler's study looks each suggested configuration up in the grid
(infeasible ones told exactly as the live tuner tells them), and we count the trials until the best feasible
value so far is within `tolerance` of the grid's best.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from sweep.tune.study import feasible

SAMPLERS: dict[str, Callable[[int], optuna.samplers.BaseSampler]] = {
    "tpe": lambda seed: optuna.samplers.TPESampler(seed=seed),  # the tuner's own sampler
    "random": lambda seed: optuna.samplers.RandomSampler(seed=seed),
}


def _key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True)


def _feasible(trial: optuna.trial.FrozenTrial, objective: str) -> bool:
    """Feasibility under the tuner's current rules: the engine started; for max-load, some load met the SLO."""
    constraints = trial.constraints
    return constraints.get("starts", -1.0) <= 0 and (objective != "max-load" or constraints.get("slo", 0.0) <= 0)


def export_grid(study: optuna.Study) -> dict[str, Any]:
    """The fixture: the space, and one entry per measured combination (the last measurement when repeated)."""
    if len(study.directions) != 1:
        raise ValueError("grid replay needs a single-objective study (max-load or goodput)")
    trials = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    if not trials:
        raise ValueError(f"study {study.study_name!r} has no completed trial to export")
    objective = study.user_attrs.get("objective", "max-load")
    space: dict[str, list[Any]] = {}
    for trial in trials:
        for name, dist in trial.distributions.items():
            space[name] = list(getattr(dist, "choices", []))
    entries = {}
    for t in trials:
        error = (t.user_attrs.get("error") or "")[:200]
        entries[_key(t.params)] = {"params": t.params, "value": t.values[0], "feasible": _feasible(t, objective),
                                   "status": t.user_attrs.get("status"), "error": error}
    return {"study": study.study_name, "metric": (study.metric_names or ["value"])[0],
            "direction": study.direction.name.lower(), "info": study.user_attrs, "space": space,
            "exported": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "trials": list(entries.values())}


def grid_best(grid: dict[str, Any]) -> float:
    values = [e["value"] for e in grid["trials"] if e["feasible"]]
    if not values:
        raise ValueError("the grid has no feasible configuration")
    return max(values) if grid["direction"] == "maximize" else min(values)


def trials_to_reach(grid: dict[str, Any], sampler: optuna.samplers.BaseSampler, tolerance: float = 0.05,
                    budget: int = 100) -> int | None:
    """Trials until the best feasible value is within `tolerance` of the grid's best (None: not within budget)."""
    lookup = {_key(e["params"]): e for e in grid["trials"]}
    maximize = grid["direction"] == "maximize"
    best = grid_best(grid)
    target = best * (1 - tolerance) if maximize else best * (1 + tolerance)
    missing = [p for p in lookup.values() if p["params"].keys() != grid["space"].keys()]
    if missing:
        raise ValueError(f"grid entries with other parameters than the space: {missing[:1]}")

    def objective(trial: optuna.Trial) -> float:
        params = {name: trial.suggest_categorical(name, choices) for name, choices in grid["space"].items()}
        entry = lookup.get(_key(params))
        if entry is None:
            raise KeyError(f"the grid did not measure {params}")
        trial.set_constraint("starts", -1.0 if entry["feasible"] else 1.0)
        return entry["value"]

    study = optuna.create_study(direction=grid["direction"], sampler=sampler)
    for n in range(1, budget + 1):
        study.optimize(objective, n_trials=1)
        done = [t for t in study.trials if t.state == TrialState.COMPLETE and feasible(t)]
        if done and any((t.values[0] >= target) if maximize else (t.values[0] <= target) for t in done):
            return n
    return None


def efficiency(grid: dict[str, Any], seeds: int, tolerance: float, budget: int,
               samplers: dict[str, Callable[[int], optuna.samplers.BaseSampler]] = SAMPLERS,
               progress: Callable[[], None] | None = None) -> dict[str, dict[str, Any]]:
    """Per sampler: trials to reach within `tolerance` of the grid's best over `seeds` seeds."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    results: dict[str, dict[str, Any]] = {}
    for name, make in samplers.items():
        counts = []
        for seed in range(seeds):
            counts.append(trials_to_reach(grid, make(seed), tolerance, budget))
            if progress is not None:
                progress()
        reached = sorted(c for c in counts if c is not None)
        results[name] = {
            "counts": counts,
            "reached": len(reached),
            "median": statistics.median(c if c is not None else budget + 1 for c in counts),
            "mean_reached": statistics.fmean(reached) if reached else None,
            "p90": sorted(c if c is not None else budget + 1 for c in counts)[int(0.9 * (len(counts) - 1))],
        }
    return results


def load_grid(path: Path) -> dict[str, Any]:
    grid = json.loads(path.read_text())
    for key in ("space", "trials", "direction"):
        if key not in grid:
            raise ValueError(f"{path} is not a grid fixture (no {key!r}); export one with --from-storage")
    return grid
