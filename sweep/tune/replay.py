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

from sweep.tune.simulate_first import PRUNED_STATUS
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


# --- `bench lab tune-launches`: engines launched to reach near-best, with and without --simulate-first -----------

NOT_LAUNCHED_CAUSES = ("constraint", "quality")  # decided before any engine start (vLLM's static rules, perplexity)


def refused_before_launch(trial: optuna.trial.FrozenTrial) -> bool:
    """Infeasible for a reason decided before any engine start (NOT_LAUNCHED_CAUSES)."""
    return trial.user_attrs.get("status") == "infeasible" and trial.user_attrs.get("cause") in NOT_LAUNCHED_CAUSES


def launched(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether the trial started an engine: not pruned by its simulation, not refused before launch."""
    status = trial.user_attrs.get("status")
    return status is not None and status != PRUNED_STATUS and not refused_before_launch(trial)


def _measured(trial: optuna.trial.FrozenTrial) -> float | None:
    """The trial's measured value when it ran to the end on a started engine, else None."""
    if trial.state == TrialState.COMPLETE and trial.user_attrs.get("status") == "ok" and feasible(trial):
        return trial.values[0]
    return None


def study_launches(study: optuna.Study, target: float, maximize: bool,
                   reference: dict[str, float] | None = None) -> dict[str, Any]:
    """One study, in trial order: engines launched until a measured value met `target` (`launches_to_target`), and
    until a launched configuration whose `reference` value (another study's measurement of the same configuration)
    met it (`launches_to_target_config`: immune to this study's own noise); None when never. Also the trials,
    launches, simulation-pruned and refused-before-launch counts, the best measured value, the wall time from the
    first trial's start to the last trial's end, and the order of the configurations."""
    trials = sorted((t for t in study.get_trials(deepcopy=False) if t.state.is_finished()), key=lambda t: t.number)

    def meets(value: float | None) -> bool:
        return value is not None and (value >= target if maximize else value <= target)

    launches = 0
    reached: int | None = None
    reached_trial: int | None = None
    reached_config: int | None = None
    for t in trials:
        if launched(t):
            launches += 1
            if reached_config is None and reference is not None and meets(reference.get(_key(t.params))):
                reached_config = launches
        if reached is None and meets(_measured(t)):
            reached, reached_trial = launches, t.number
    values = [v for t in trials if (v := _measured(t)) is not None]
    starts = [t.datetime_start for t in trials if t.datetime_start is not None]
    ends = [t.datetime_complete for t in trials if t.datetime_complete is not None]
    return {
        "trials": len(trials),
        "launched": launches,
        "pruned_by_simulation": sum(t.user_attrs.get("status") == PRUNED_STATUS for t in trials),
        "refused_before_launch": sum(map(refused_before_launch, trials)),
        "best": (max(values) if maximize else min(values)) if values else None,
        "launches_to_target": reached,
        "trial_reaching_target": reached_trial,
        "launches_to_target_config": reached_config,
        "wall_s": (max(ends) - min(starts)).total_seconds() if starts and ends else None,
        "order": [t.params for t in trials],
        "values": [_measured(t) for t in trials],
        "predicted": [(t.user_attrs.get("predicted_values") or [None])[0] for t in trials],
        "status": [t.user_attrs.get("status") for t in trials],
    }


def compare_launches(full: optuna.Study, others: dict[str, optuna.Study], tolerance: float = 0.05) -> dict[str, Any]:
    """The full grid (`full`, every configuration launched) sets the best and the target (within `tolerance` of it);
    each study, the full one included, is counted by `study_launches` against that target and the full grid's
    per-configuration values. `rerun` rows compare each configuration's value in every other study with the full
    grid's (relative difference), the run-to-run spread the 5 % target has to stand against."""
    if len(full.directions) != 1:
        raise ValueError("needs single-objective studies (goodput, cost or max-load)")
    maximize = full.direction == optuna.study.StudyDirection.MAXIMIZE
    reference = {_key(t.params): v for t in full.get_trials(deepcopy=False) if (v := _measured(t)) is not None}
    if not reference:
        raise ValueError(f"study {full.study_name!r} has no measured configuration")
    best = max(reference.values()) if maximize else min(reference.values())
    target = best * (1 - tolerance) if maximize else best * (1 + tolerance)
    best_params = json.loads(next(k for k, v in reference.items() if v == best))
    studies = {"full": study_launches(full, target, maximize, reference)}
    same_value: dict[str, list[dict[str, Any]]] = {}
    for name, study in others.items():
        studies[name] = study_launches(study, target, maximize, reference)
        rows = []
        for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
            value, ref = _measured(t), reference.get(_key(t.params))
            if value is not None and ref is not None:
                rows.append({"params": t.params, "full": ref, name: value,
                             "relative": (value - ref) / ref if ref else None})
        same_value[name] = rows
    return {"tolerance": tolerance, "direction": "maximize" if maximize else "minimize", "best": best,
            "best_params": best_params, "target": target, "studies": studies, "same_configuration": same_value,
            "same_configuration_spread": {name: relative_spread(rows) for name, rows in same_value.items()},
            "same_order": {name: s["order"] == studies["full"]["order"] for name, s in studies.items()}}


def relative_spread(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Pairs of one configuration measured in two studies: how many, and the median and max |relative difference|
    (None without a pair)."""
    rel = [abs(r["relative"]) for r in rows if r["relative"] is not None]
    return {"pairs": len(rows), "median": statistics.median(rel) if rel else None, "max": max(rel, default=None)}


def open_single_study(where: str) -> optuna.Study:
    """A `bench tune` output directory (its tune.db) or a storage URL holding exactly one study."""
    if "://" not in where and not Path(where, "tune.db").is_file():
        raise ValueError(f"{where} has no tune.db (give a `bench tune` output directory or a storage URL)")
    url = where if "://" in where else f"sqlite:///{Path(where, 'tune.db').resolve()}"
    names = optuna.get_all_study_names(url)
    if len(names) != 1:
        raise ValueError(f"{where} holds {len(names)} studies ({names}); expected one")
    return optuna.load_study(study_name=names[0], storage=url)
