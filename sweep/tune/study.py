"""The Optuna study around the objective: storage, sampler, pruning, infeasible trials, repeats, resume, progress.

- Storage: an SQLite file in the output directory by default (a killed study resumes with the same command), or
  any Optuna RDB URL (`postgresql://...`) shared by N workers. Trials of a dead worker are failed and re-queued
  with the same parameters: at once when the worker was on this machine, else by Optuna's heartbeat.
- Infeasible configurations (known constraint broken, engine fails to start, OOM, crash, stops answering, runs past
  the trial timeout) are COMPLETE trials with pessimistic values, a violated `starts` constraint, and their error
  and its one-word `cause` as user attributes: TPE learns from them, and the study goes on.
- `n_trials` is the study's total of finished trials, so rerunning the same command finishes the study.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import time
import traceback
import warnings
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import optuna
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState

from sweep.tune.backend import process_start, reap_orphan_engine, startup_seconds
from sweep.tune.objective import (
    Evaluation,
    Infeasible,
    MeasurePoint,
    ObjectiveSpec,
    attainment_violation,
    combine_repeats,
    evaluate,
)
from sweep.tune.quality_guard import QualityGuard
from sweep.tune.space import SearchSpace, known_constraint_violation

HEARTBEAT_INTERVAL_S = 10
GRACE_PERIOD_S = 60
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
ERROR_CHARS = 4000  # of an infeasible trial's reason kept in its `error` user attribute
# The storage each study from `open_study` was opened on: a dead worker's trials are failed through its public API
# (Optuna keeps a study's own storage private).
_STORAGES: weakref.WeakKeyDictionary[optuna.Study, RDBStorage] = weakref.WeakKeyDictionary()


class TrialBackend(Protocol):
    """Starts an engine with a configuration and measures load points against it."""

    def launch(self, knobs: dict[str, Any], trial_dir: Path) -> contextlib.AbstractContextManager[
        Callable[[int], MeasurePoint]
    ]:
        """Start the engine (raise `Infeasible` if it cannot); yield `repeat index -> measure(load) -> point`."""
        ...


def storage_url(storage: str | None, output_dir: Path) -> str:
    if storage is None:
        return f"sqlite:///{(output_dir / 'tune.db').resolve()}"
    if "://" not in storage:  # a plain path is an SQLite file
        return f"sqlite:///{Path(storage).resolve()}"
    return storage


def open_storage(url: str, attempts: int = 5) -> RDBStorage:
    """The RDB storage with heartbeats; retried because workers starting together race to create its schema."""
    import sqlalchemy.exc

    engine_kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        engine_kwargs["connect_args"] = {"timeout": 60}
    else:
        engine_kwargs["pool_pre_ping"] = True
    for attempt in range(attempts):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return RDBStorage(
                    url,
                    engine_kwargs=engine_kwargs,
                    heartbeat_interval=HEARTBEAT_INTERVAL_S,
                    grace_period=GRACE_PERIOD_S,
                    heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=2),
                )
        except sqlalchemy.exc.SQLAlchemyError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.5 + random.random() * (attempt + 1))
    raise AssertionError("unreachable")


def open_study(url: str, study_name: str, spec: ObjectiveSpec, seed: int, info: dict[str, Any],
               grid: dict[str, list[Any]] | None = None) -> optuna.Study:
    """Create the study, or load it when it exists (the same command resumes it).

    TPE by default; with `grid`, Optuna's GridSampler measures every combination once (vLLM auto_tune's grid).
    """
    storage = open_storage(url)
    # One SQLite worker is reproducible from the seed; workers sharing a server need distinct seeds.
    sampler_seed = seed if url.startswith("sqlite") else seed + os.getpid()
    sampler: optuna.samplers.BaseSampler = (
        optuna.samplers.GridSampler(grid, seed=sampler_seed) if grid else optuna.samplers.TPESampler(seed=sampler_seed)
    )
    # Max-load reports the largest passing load after each point: 0 after the first level means the config misses
    # the SLO even at the lowest load, so it stops there. Pruners are single-objective only.
    pruner: optuna.pruners.BasePruner = (
        optuna.pruners.ThresholdPruner(lower=1e-9, n_warmup_steps=0) if spec.kind == "max-load"
        else optuna.pruners.NopPruner()
    )
    study = optuna.create_study(storage=storage, study_name=study_name, sampler=sampler, pruner=pruner,
                                directions=spec.directions, load_if_exists=True)
    if [d.name.lower() for d in study.directions] != spec.directions:
        raise ValueError(f"study {study_name!r} exists with directions {study.directions}; this run needs "
                         f"{spec.directions} ({spec.kind}); pick another --study-name")
    _STORAGES[study] = storage
    if not study.metric_names:
        study.set_metric_names(spec.metric_names)
    for key, value in info.items():
        if key not in study.user_attrs:
            study.set_user_attr(key, value)
    return study


def check_space_matches(study: optuna.Study, space: SearchSpace) -> None:
    """A resumed or shared study must keep its search space; say which knob differs instead of failing trials."""
    previous = next(iter(study.get_trials(deepcopy=False, states=FINISHED)), None)
    if previous is None:
        return
    wanted = {k.name: k.distribution() for k in space.knobs}
    if set(previous.distributions) != set(wanted):
        raise ValueError(f"study {study.study_name!r} searches {sorted(previous.distributions)}, this command "
                         f"{sorted(wanted)}; use the original --space or a new --study-name")
    for name, dist in previous.distributions.items():
        if dist != wanted[name]:
            raise ValueError(f"study {study.study_name!r} has {name} as {dist}, this command as {wanted[name]}; "
                             "use the original --space or a new --study-name")


def worker_identity() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "start": process_start(os.getpid())}


def recover_dead_local_trials(study: optuna.Study) -> list[int]:
    """Fail RUNNING trials whose worker process on this machine is gone, and re-queue their parameters (studies
    from `open_study`; on any other, Optuna's heartbeat alone fails them)."""
    storage = _STORAGES.get(study)
    if storage is None:
        return []
    study_id = storage.get_study_id_from_name(study.study_name)
    here = socket.gethostname()
    recovered = []
    retry = RetryHeartbeatStaleTrialCallback(max_retry=2)
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        worker = trial.user_attrs.get("worker")
        if not worker or worker.get("host") != here:
            continue
        if process_start(worker["pid"]) is not None and process_start(worker["pid"]) == worker.get("start"):
            continue  # still running
        if run_dir := trial.user_attrs.get("run_dir"):
            reap_orphan_engine(Path(run_dir))
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
        with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
            storage.set_trial_user_attr(trial_id, "error", f"worker {worker['pid']} died mid-trial")
            if storage.set_trial_state_values(trial_id, state=TrialState.FAIL):
                recovered.append(trial.number)
                retry(study, storage.get_trial(trial_id))
    return recovered


def feasible(trial: FrozenTrial) -> bool:
    return all(v <= 0 for v in trial.constraints.values())


def best_trials(study: optuna.Study) -> list[FrozenTrial]:
    """The best feasible trial (single objective) or the feasible Pareto front (two objectives)."""
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if feasible(t)]
    if not done:
        return []
    if len(study.directions) == 1:
        sign = 1 if study.direction == optuna.study.StudyDirection.MAXIMIZE else -1
        return [max(done, key=lambda t: (sign * t.values[0], -t.number))]
    signs = [1 if d == optuna.study.StudyDirection.MAXIMIZE else -1 for d in study.directions]

    def dominates(a: FrozenTrial, b: FrozenTrial) -> bool:
        pa = [s * v for s, v in zip(signs, a.values, strict=True)]
        pb = [s * v for s, v in zip(signs, b.values, strict=True)]
        return all(x >= y for x, y in zip(pa, pb, strict=True)) and pa != pb

    return [t for t in done if not any(dominates(o, t) for o in done)]


class TuneObjective:
    """The callable Optuna runs per trial."""

    def __init__(self, space: SearchSpace, spec: ObjectiveSpec, backend: TrialBackend, output_dir: Path,
                 repeats: int = 1, model_max_len: int | None = None, quality_guard: QualityGuard | None = None
                 ) -> None:
        if repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {repeats}")
        self.space, self.spec, self.backend = space, spec, backend
        self.output_dir, self.repeats, self.model_max_len = output_dir, repeats, model_max_len
        self.quality_guard = quality_guard

    def _constrain(self, trial: optuna.Trial, started: bool, slo_violation: float) -> None:
        """Soft constraints (feasible iff all <= 0). `slo` only for max-load, where a value of 0 means the SLO is
        missed at every load, and cost, which is minimised subject to the attainment target; goodput already counts
        SLO misses, so a goodput trial is feasible once it starts."""
        trial.set_constraint("starts", -1.0 if started else 1.0)
        if self.spec.kind in ("max-load", "cost"):
            trial.set_constraint("slo", slo_violation)

    def _infeasible(self, trial: optuna.Trial, reason: str, cause: str, engine_error: str | None = None
                    ) -> list[float]:
        """Record the trial infeasible; the engine's own error line, when there is one, leads its `error` (kept
        whole, the rest of the reason clipped from the front to fit) and is `engine_error` too."""
        trial.set_user_attr("status", "infeasible")
        trial.set_user_attr("cause", cause)
        if engine_error:
            engine_error = engine_error[:1000]
            trial.set_user_attr("engine_error", engine_error)
            reason = f"{engine_error}\n{reason[-(ERROR_CHARS - len(engine_error) - 1):]}"
        trial.set_user_attr("error", reason[-ERROR_CHARS:])
        self._constrain(trial, started=False, slo_violation=self.spec.attainment)
        return self.spec.infeasible_values()

    @staticmethod
    def _record_startup(trial: optuna.Trial, trial_dir: Path) -> None:
        """`startup_s`: the engine's spawn-to-healthy seconds (vLLM's CPU build: minutes), not part of any point."""
        if (seconds := startup_seconds(trial_dir)) is not None:
            trial.set_user_attr("startup_s", round(seconds, 3))

    def _on_point(self, trial: optuna.Trial, repeat: int) -> Callable[[int, float, dict[str, Any]], None]:
        def on_point(step: int, best_passing: float, point: dict[str, Any]) -> None:
            trial.set_user_attr(f"r{repeat}_point{step:02d}", point_summary(point))
            if repeat == 0 and len(self.spec.directions) == 1:
                trial.report(best_passing, step)
                if trial.should_prune():
                    trial.set_user_attr("status", "pruned")
                    self._constrain(trial, started=True, slo_violation=self.spec.attainment)
                    raise optuna.TrialPruned(f"no load level met the SLO at attainment {self.spec.attainment}")
        return on_point

    def __call__(self, trial: optuna.Trial) -> float | list[float]:
        try:
            values = self._run(trial)
        except optuna.TrialPruned:
            raise
        except Exception as err:  # kept as a FAIL trial with its traceback; `run_study` stops repeated ones
            trial.set_user_attr("status", "error")
            trial.set_user_attr("error", "".join(traceback.format_exception(err))[-4000:])
            raise
        return values[0] if len(values) == 1 else values

    def _run(self, trial: optuna.Trial) -> list[float]:
        knobs = self.space.suggest(trial)
        trial.set_user_attr("worker", worker_identity())
        trial.set_user_attr("knobs", knobs)
        trial_dir = self.output_dir / "trials" / f"trial_{trial.number:04d}"
        trial.set_user_attr("run_dir", str(trial_dir.resolve()))
        if violation := known_constraint_violation(knobs, self.model_max_len):
            return self._infeasible(trial, f"known constraint: {violation}", "constraint")
        evaluations: list[Evaluation] = []
        try:
            if self.quality_guard is not None:
                quality = self.quality_guard.quality(trial.study, knobs)
                trial.set_user_attr("perplexity_increase", quality["perplexity_increase"])
                if violation := self.quality_guard.violation(quality):
                    return self._infeasible(trial, violation, "quality")
            with self.backend.launch(knobs, trial_dir) as measure_for_repeat:
                for repeat in range(self.repeats):
                    evaluations.append(evaluate(self.spec, measure_for_repeat(repeat), self._on_point(trial, repeat)))
        except Infeasible as err:
            self._record_startup(trial, trial_dir)
            return self._infeasible(trial, str(err), err.cause, err.engine_error)
        self._record_startup(trial, trial_dir)
        values, spreads = combine_repeats(evaluations)
        trial.set_user_attr("status", "ok")
        trial.set_user_attr("repeat_values", [e.values for e in evaluations])
        trial.set_user_attr("spread", spreads)
        median_run = min(evaluations, key=lambda e: abs(e.values[0] - values[0]))  # the repeat the value stands for
        decisive = decisive_point(self.spec, median_run)
        if decisive is not None:
            trial.set_user_attr("metrics", {k: v for k, v in decisive.items() if _is_scalar(v)})
        if evaluations[0].bracket is not None:
            trial.set_user_attr("bracket", list(evaluations[0].bracket))
        violation = max(attainment_violation(self.spec, e) for e in evaluations)
        trial.set_user_attr("attainment_shortfall", violation)
        self._constrain(trial, started=True, slo_violation=violation)
        return values


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (int, float, str, bool))


def point_summary(point: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in point.items() if _is_scalar(v)}


def decisive_point(spec: ObjectiveSpec, evaluation: Evaluation) -> dict[str, Any] | None:
    """The point whose metrics the objective value stands for: the largest passing load for max-load."""
    if spec.kind != "max-load":
        return evaluation.points[0] if evaluation.points else None
    passing = [p for p in evaluation.points if spec.passes(p)]
    key = "max_concurrency" if spec.load_mode == "concurrency" else "request_rate"
    return max(passing, key=lambda p: float(p.get(key) or 0)) if passing else None


def finished_count(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=FINISHED))


@contextlib.contextmanager
def _progress(study: optuna.Study, n_trials: int, timeout: float | None) -> Iterator[Callable[..., None]]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    start = time.monotonic()
    done_at_start = finished_count(study)
    with Progress(TextColumn("[bold]tune"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}")) as progress:
        task = progress.add_task("", total=n_trials, completed=done_at_start)

        def update(study: optuna.Study, _trial: FrozenTrial | None = None) -> None:
            done = finished_count(study)
            elapsed = time.monotonic() - start
            best = best_trials(study)
            best_text = ("best " + ", ".join(f"{v:.4g}" for v in best[0].values) + f" (#{best[0].number})"
                         if len(best) == 1 else f"{len(best)} on the Pareto front" if best else "no feasible trial yet")
            per_trial = elapsed / max(done - done_at_start, 1)
            left = per_trial * max(n_trials - done, 0) if done > done_at_start else None
            if timeout is not None:
                left = min(left, timeout - elapsed) if left is not None else timeout - elapsed
            left_text = f"~{max(left, 0):.0f}s left" if left is not None else "time left: after the first trial"
            progress.update(task, completed=done, description=f"{best_text} | {left_text}")

        update(study)
        yield update


class TuneAborted(RuntimeError):
    """Trials keep failing with unexpected errors (a bug or a broken environment, not an infeasible config)."""


def run_study(study: optuna.Study, objective: TuneObjective, n_trials: int, timeout: float | None,
              show_progress: bool = True, max_consecutive_errors: int = 3) -> None:
    """Run trials until the study holds `n_trials` finished trials (all workers together) or `timeout` passes.

    A trial that raises an unexpected error is kept as FAIL with its traceback; after `max_consecutive_errors`
    in a row this worker stops with `TuneAborted` instead of burning the budget on the same error.
    """
    recover_dead_local_trials(study)
    optuna.storages.fail_stale_trials(study)
    if finished_count(study) >= n_trials:
        return
    errors: list[FrozenTrial] = []

    def stop_when_done(study: optuna.Study, trial: FrozenTrial) -> None:
        errors[:] = [*errors, trial] if trial.state == TrialState.FAIL else []
        running = len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))
        if finished_count(study) + running >= n_trials or len(errors) >= max_consecutive_errors:
            study.stop()

    progress = _progress(study, n_trials, timeout) if show_progress else contextlib.nullcontext(None)
    with progress as update:
        callbacks = [stop_when_done] + ([update] if update is not None else [])
        study.optimize(objective, n_trials=None, timeout=timeout, callbacks=callbacks, catch=(Exception,))
    if len(errors) >= max_consecutive_errors:
        last = errors[-1].user_attrs.get("error", "(no error recorded)")
        raise TuneAborted(f"{len(errors)} trials in a row failed with unexpected errors "
                          f"(trials {[t.number for t in errors]}); the last one:\n{last}")
