"""`bench tune --simulate-first PROFILE`: every configuration is simulated before it is launched.

`SimulatedBackend` is a `TrialBackend` whose "engine" is `bench simulate`'s (the real scheduler and KV manager in
virtual time, sweep/simulate_run.py): the objective is evaluated on it exactly as on a real engine (the same
max-load search or fixed-load point), into `trial_NNNN/simulated/`. `SimulateFirstObjective` then launches the
configuration for real only when the prediction is promising: a configuration predicted infeasible (it cannot
hold a sequence, or misses the attainment target at every load for max-load and cost) or worse than the best
measured trial so far by more than `margin` is recorded as PRUNED, with its prediction and the reason, and never
launched. A configuration the profile did not measure (another tensor-parallel size, say) is launched
unpredicted, and so is one with speculative decoding: the simulator does not model it (its tokens are not the
model's, so it cannot tell which drafts a model would accept, and it costs no draft-model passes). Every trial
keeps `predicted_values` (and the predicted decisive point's metrics in `predicted_metrics`), so the report shows
predicted against measured for every launched trial.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from sweep.tune.backend import TrialWorkload
from sweep.tune.objective import Evaluation, Infeasible, MeasurePoint, attainment_violation, evaluate
from sweep.tune.space import known_constraint_violation
from sweep.tune.study import TuneObjective, _decisive_point, _point_summary, feasible

PRUNED_STATUS = "pruned by simulation"


class Unpredictable(RuntimeError):
    """The profile did not measure this configuration (another model, dtype, device or tensor-parallel size), or
    the simulator does not model it (speculative decoding)."""


class SimulatedBackend:
    """A `TrialBackend` that simulates each configuration with a `bench profile` cost model."""

    def __init__(self, profile: Any, workload: TrialWorkload, extra_knobs: dict[str, Any] | None = None) -> None:
        self.profile, self.workload = profile, workload
        self.extra_knobs = extra_knobs or {}

    @contextlib.contextmanager
    def launch(self, knobs: dict[str, Any], trial_dir: Path) -> Iterator[Callable[[int], MeasurePoint]]:
        from rich.console import Console

        from sweep.cost import CostConfig
        from sweep.runner import WorkloadConfig
        from sweep.simulate_run import SimulateConfig, Simulator

        w = self.workload
        from sweep.simulate_run import PROFILE_FIXED_KNOBS

        wanted = {**self.extra_knobs, **knobs, "model": w.model}
        if wanted.get("speculative_config") is not None:
            raise Unpredictable(f"the simulator does not model speculative decoding ({wanted['speculative_config']})")
        for name in PROFILE_FIXED_KNOBS:
            profiled = self.profile.knobs.get(name)
            if wanted.get(name) is not None and profiled is not None and wanted[name] != profiled:
                raise Unpredictable(f"the profile measured {name}={profiled}, this configuration has {wanted[name]}")
        config = SimulateConfig(
            output_dir=trial_dir / "simulated",
            profile=self.profile,
            mode=w.load_mode,
            engine_knobs={**self.extra_knobs, **knobs, "model": w.model},
            workload=WorkloadConfig(workload=w.workload, input_len=w.input_len, output_len=w.output_len,
                                    seed=w.seed, endpoint=w.endpoint, max_model_len=knobs.get("max_model_len")),
            num_prompts=w.num_prompts,
            burstiness=w.burstiness,
            slo=w.slo or None,
            percentiles=list(w.percentiles),
            resume=True,
            cost=CostConfig(w.cost_per_hour, w.gpus_per_instance) if w.cost_per_hour is not None else None,
        )  # fmt: skip
        try:
            simulator = Simulator(config, console=Console(stderr=True, quiet=True))
        except ValueError as err:  # the engine would refuse it: a knob error, or no room for one sequence
            raise Infeasible(f"simulation: {err}", cause="simulation") from err

        def measure(load: float) -> dict[str, Any]:
            if w.load_mode == "concurrency":
                config.num_prompts = max(w.num_prompts, int(load))
            return simulator.measure(load)

        yield lambda repeat: measure


class SimulateFirstObjective(TuneObjective):
    """A TuneObjective that simulates each trial first and launches only the promising ones."""

    def __init__(self, *args: Any, simulator: SimulatedBackend, margin: float = 0.2, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if len(self.spec.directions) != 1:
            raise ValueError("--simulate-first needs a single objective (max-load, goodput or cost), not pareto")
        if not 0.0 <= margin < 1.0:
            raise ValueError(f"--prune-margin must be in [0, 1), got {margin}")
        self.simulator, self.margin = simulator, margin

    def _run(self, trial: optuna.Trial) -> list[float]:
        knobs = self.space.suggest(trial)  # the same values super()._run gets: a trial suggests each name once
        if known_constraint_violation(knobs, self.model_max_len):
            return super()._run(trial)
        trial_dir = self.output_dir / "trials" / f"trial_{trial.number:04d}"
        try:
            with self.simulator.launch(knobs, trial_dir) as for_repeat:
                prediction = evaluate(self.spec, for_repeat(0))
        except Infeasible as err:
            return self._prune(trial, knobs, None, f"predicted infeasible: {err}")
        except Unpredictable as err:  # no prediction: the configuration runs for real
            trial.set_user_attr("prediction", f"none: {err}")
            return super()._run(trial)
        trial.set_user_attr("predicted_values", prediction.values)
        decisive = _decisive_point(self.spec, prediction)
        if decisive is not None:
            trial.set_user_attr("predicted_metrics", _point_summary(decisive))
        if reason := self.prune_reason(trial.study, prediction):
            return self._prune(trial, knobs, prediction, reason)
        return super()._run(trial)

    def prune_reason(self, study: optuna.Study, prediction: Evaluation) -> str | None:
        """Why a prediction is not worth launching, or None."""
        if self.spec.kind in ("max-load", "cost") and attainment_violation(self.spec, prediction) > 0:
            return f"predicted to miss attainment {self.spec.attainment} at every load tried"
        measured = [
            t.values[0] for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if feasible(t) and t.user_attrs.get("status") == "ok"
        ]  # fmt: skip
        if not measured:
            return None
        predicted = prediction.values[0]
        if self.spec.directions[0] == "maximize":
            best = max(measured)
            if predicted < best * (1 - self.margin):
                return f"predicted {predicted:.4g} < best measured {best:.4g} by more than {self.margin:.0%}"
        else:
            best = min(measured)
            if predicted > best * (1 + self.margin):
                return f"predicted {predicted:.4g} > best measured {best:.4g} by more than {self.margin:.0%}"
        return None

    def _prune(self, trial: optuna.Trial, knobs: dict[str, Any], prediction: Evaluation | None, reason: str) -> Any:
        trial.set_user_attr("knobs", knobs)
        trial.set_user_attr("status", PRUNED_STATUS)
        trial.set_user_attr("error", reason)
        self._constrain(trial, started=True, slo_violation=self.spec.attainment)
        if prediction is not None:
            trial.report(prediction.values[0], 0)
        raise optuna.TrialPruned(reason)
