"""`bench tune --simulate-first PROFILE`: every configuration is simulated before it is launched.

`SimulatedBackend` is a `TrialBackend` whose "engine" is `bench simulate`'s (the real scheduler and KV manager in
virtual time, sweep/simulate/simulation.py): the objective is evaluated on it exactly as on a real engine (the same
max-load search or fixed-load point), into `trial_NNNN/simulated/`. `SimulateFirstObjective` then launches the
configuration for real unless the prediction is hopeless (`SimulateFirstObjective.decide`): a configuration
the engine would refuse (it cannot hold a sequence) is PRUNED at once; one predicted to miss the attainment target
at every load (max-load and cost) or to be worse by more than `margin` than the reference (the less demanding of
the best measured trial's measured value and its own prediction) is simulated again with every step
1 / (1 + step_error) as long (`optimistic`, into `trial_NNNN/simulated_optimistic/`), and PRUNED only when that
optimistic prediction is hopeless too. A pruned trial is recorded with its predictions and the reason, and never
launched. A configuration the profile did not measure (another tensor-parallel size, say) is launched
unpredicted, and so is one with speculative decoding: the simulator does not model it (its tokens are not the
model's, so it cannot tell which drafts a model would accept, and it costs no draft-model passes). Every trial
keeps `predicted_values` (and the predicted decisive point's metrics in `predicted_metrics`) and, when it was
predicted, `prune_decision` (what the decision was based on), so the report shows predicted against measured.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from sweep.tune.backend import TrialWorkload
from sweep.tune.objective import Evaluation, Infeasible, MeasurePoint, attainment_violation, evaluate
from sweep.tune.space import known_constraint_violation
from sweep.tune.study import TrialBackend, TuneObjective, decisive_point, feasible, point_summary

PRUNED_STATUS = "pruned by simulation"


class Unpredictable(RuntimeError):
    """The profile did not measure this configuration (another model, dtype, device or tensor-parallel size), or
    the simulator does not model it (speculative decoding)."""


def profile_step_error(profile: Any) -> float:
    """The profile's own worst relative step-time error: the fit's leave-one-out max when it has one, else the
    in-sample max, else 0."""
    error = profile.cost_model.fit_error
    return float(error.get("loo_max_rel_error", error.get("max_rel_error", 0.0)))


def resolve_step_error(value: str, profile: Any) -> float:
    """`--prune-step-error`: 'profile' (the profile's own error, `profile_step_error`) or a relative error >= 0."""
    if value == "profile":
        return profile_step_error(profile)
    try:
        error = float(value)
    except ValueError:
        error = math.nan
    if not (math.isfinite(error) and error >= 0):
        raise ValueError(f"--prune-step-error must be 'profile' or a relative step-time error >= 0 (e.g. 0.3), "
                         f"got {value!r}")
    return error


def scaled_profile(profile: Any, factor: float) -> Any:
    """The profile with every simulated step `factor` times as long: every term of the cost model, serving terms
    included, is a coefficient times a step feature, so scaling the coefficients scales the step time exactly."""
    model = profile.cost_model
    scaled = dataclasses.replace(model, coefficients={k: v * factor for k, v in model.coefficients.items()},
                                 serving={k: v * factor for k, v in model.serving.items()})  # fmt: skip
    return dataclasses.replace(profile, cost_model=scaled)


class SimulatedBackend:
    """A `TrialBackend` that simulates each configuration with a `bench model profile` cost model."""

    def __init__(self, profile: Any, workload: TrialWorkload, extra_knobs: dict[str, Any] | None = None,
                 subdir: str = "simulated") -> None:
        self.profile, self.workload = profile, workload
        self.extra_knobs, self.subdir = extra_knobs or {}, subdir

    def optimistic(self, step_error: float) -> SimulatedBackend:
        """The same simulator with every step 1 / (1 + step_error) as long, writing into `simulated_optimistic/`."""
        return SimulatedBackend(scaled_profile(self.profile, 1.0 / (1.0 + step_error)), self.workload,
                                self.extra_knobs, subdir="simulated_optimistic")  # fmt: skip

    @contextlib.contextmanager
    def launch(self, knobs: dict[str, Any], trial_dir: Path) -> Iterator[Callable[[int], MeasurePoint]]:
        from rich.console import Console

        from sweep.run.cost import CostConfig
        from sweep.simulate.simulation import SimulateConfig, Simulator

        w = self.workload
        from sweep.simulate.simulation import PROFILE_FIXED_KNOBS

        wanted = {**self.extra_knobs, **knobs, "model": w.model}
        if wanted.get("speculative_config") is not None:
            raise Unpredictable(f"the simulator does not model speculative decoding ({wanted['speculative_config']})")
        for name in PROFILE_FIXED_KNOBS:
            profiled = self.profile.knobs.get(name)
            if wanted.get(name) is not None and profiled is not None and wanted[name] != profiled:
                raise Unpredictable(f"the profile measured {name}={profiled}, this configuration has {wanted[name]}")
        config = SimulateConfig(
            output_dir=trial_dir / self.subdir,
            profile=self.profile,
            mode=w.load_mode,
            engine_knobs={**self.extra_knobs, **knobs, "model": w.model},
            workload=w.workload_config(knobs.get("max_model_len")),
            num_prompts=w.num_prompts,
            duration=w.duration,
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
            config.num_prompts = w.prompts_for(load)
            return simulator.measure(load)

        yield lambda repeat: measure


def simulators(profile: Any, workload: TrialWorkload, step_error: float) -> tuple[SimulatedBackend,
                                                                                  SimulatedBackend | None]:
    """The nominal simulator and the optimistic one (None when `step_error` is 0: the prediction decides alone)."""
    nominal = SimulatedBackend(profile, workload)
    return nominal, (nominal.optimistic(step_error) if step_error > 0 else None)


class SimulateFirstObjective(TuneObjective):
    """A TuneObjective that simulates each trial first and launches all but the hopeless ones.

    `optimistic`: the simulator with steps 1 / (1 + step_error) as long (None: the nominal prediction decides
    alone); `step_error` is recorded with each decision.
    """

    def __init__(self, *args: Any, simulator: TrialBackend, margin: float = 0.2,
                 optimistic: TrialBackend | None = None, step_error: float = 0.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if len(self.spec.directions) != 1:
            raise ValueError("--simulate-first needs a single objective (max-load, goodput or cost), not pareto")
        if not 0.0 <= margin < 1.0:
            raise ValueError(f"--prune-margin must be in [0, 1), got {margin}")
        self.simulator, self.margin = simulator, margin
        self.optimistic, self.step_error = optimistic, step_error

    def _run(self, trial: optuna.Trial) -> list[float]:
        knobs = self.space.suggest(trial)  # the same values super()._run gets: a trial suggests each name once
        if known_constraint_violation(knobs, self.model_max_len):
            return super()._run(trial)
        trial_dir = self.output_dir / "trials" / f"trial_{trial.number:04d}"
        try:
            prediction = self._predict(self.simulator, knobs, trial_dir)
        except Infeasible as err:  # refused: no room for one sequence, a knob error; no timing could change that
            trial.set_user_attr("prune_decision", {"decision": "prune", "reason": f"predicted infeasible: {err}"})
            return self._prune(trial, knobs, None, f"predicted infeasible: {err}")
        except Unpredictable as err:  # no prediction: the configuration runs for real
            trial.set_user_attr("prediction", f"none: {err}")
            return super()._run(trial)
        trial.set_user_attr("predicted_values", prediction.values)
        decisive = decisive_point(self.spec, prediction)
        if decisive is not None:
            trial.set_user_attr("predicted_metrics", point_summary(decisive))
        decision = self.decide(trial.study, knobs, trial_dir, prediction)
        trial.set_user_attr("prune_decision", decision)
        if decision["decision"] == "prune":
            return self._prune(trial, knobs, prediction, decision["reason"])
        return super()._run(trial)

    def _predict(self, backend: TrialBackend, knobs: dict[str, Any], trial_dir: Path) -> Evaluation:
        with backend.launch(knobs, trial_dir) as for_repeat:
            return evaluate(self.spec, for_repeat(0))

    def reference(self, study: optuna.Study) -> dict[str, Any] | None:
        """What a prediction is held against: the best measured trial so far, and the less demanding of its
        measured value and its own prediction (`value`; the measured value alone when it was not predicted)."""
        measured = [
            t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if feasible(t) and t.user_attrs.get("status") == "ok"
        ]  # fmt: skip
        if not measured:
            return None
        maximize = self.spec.directions[0] == "maximize"
        best = (max if maximize else min)(measured, key=lambda t: t.values[0])
        predicted = (best.user_attrs.get("predicted_values") or [None])[0]
        value = best.values[0] if predicted is None else (min if maximize else max)(best.values[0], predicted)
        return {"trial": best.number, "measured": best.values[0], "predicted": predicted, "value": value}

    def hopeless(self, prediction: Evaluation, reference: dict[str, Any] | None) -> str | None:
        """Why one prediction is not worth a launch against `reference`, or None."""
        if self.spec.kind in ("max-load", "cost") and attainment_violation(self.spec, prediction) > 0:
            return f"misses attainment {self.spec.attainment} at every load tried"
        if reference is None:
            return None
        value, ref = prediction.values[0], reference["value"]
        if self.spec.directions[0] == "maximize" and value < ref * (1 - self.margin):
            return f"{value:.4g} < reference {ref:.4g} (#{reference['trial']}) by more than {self.margin:.0%}"
        if self.spec.directions[0] == "minimize" and value > ref * (1 + self.margin):
            return f"{value:.4g} > reference {ref:.4g} (#{reference['trial']}) by more than {self.margin:.0%}"
        return None

    def decide(self, study: optuna.Study, knobs: dict[str, Any], trial_dir: Path,
               prediction: Evaluation) -> dict[str, Any]:
        """Launch or prune, with what it was based on: the prediction, the optimistic one (simulated only when the
        prediction alone would prune), the reference, the margin and the step error."""
        reference = self.reference(study)
        decision: dict[str, Any] = {"decision": "launch", "predicted": prediction.values[0], "optimistic": None,
                                    "reference": reference, "margin": self.margin, "step_error": self.step_error}
        reason = self.hopeless(prediction, reference)
        if reason is None:
            return {**decision, "reason": "prediction within the margin"}
        if self.optimistic is None:
            return {**decision, "decision": "prune", "reason": f"predicted {reason}"}
        try:
            optimistic = self._predict(self.optimistic, knobs, trial_dir)
        except Infeasible as err:  # the nominal simulation accepted this configuration: not expected
            return {**decision, "decision": "prune", "reason": f"predicted {reason}; optimistic: {err}"}
        decision["optimistic"] = optimistic.values[0]
        faster = f"with steps {self.step_error:.0%} faster"
        if (optimistic_reason := self.hopeless(optimistic, reference)) is None:
            return {**decision, "reason": f"predicted {reason}, but not {faster} ({optimistic.values[0]:.4g})"}
        return {**decision, "decision": "prune", "reason": f"predicted {reason}; {faster}: {optimistic_reason}"}

    def _prune(self, trial: optuna.Trial, knobs: dict[str, Any], prediction: Evaluation | None, reason: str) -> Any:
        trial.set_user_attr("knobs", knobs)
        trial.set_user_attr("status", PRUNED_STATUS)
        trial.set_user_attr("error", reason)
        self._constrain(trial, started=True, slo_violation=self.spec.attainment)
        if prediction is not None:
            trial.report(prediction.values[0], 0)
        raise optuna.TrialPruned(reason)
