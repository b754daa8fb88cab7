"""--simulate-first: predicted-hopeless configurations are pruned unlaunched; --objective cost minimises price."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from tune_fakes import FakeBackend

from sweep.simulate.simulation import load_profile
from sweep.tune.backend import TrialWorkload
from sweep.tune.objective import NO_COST, Infeasible, ObjectiveSpec, fixed_load_evaluation
from sweep.tune.simulate_first import (
    PRUNED_STATUS,
    SimulatedBackend,
    SimulateFirstObjective,
    Unpredictable,
    profile_step_error,
    resolve_step_error,
    simulators,
)
from sweep.tune.space import DeviceInfo, build_space
from sweep.tune.study import best_trials, open_study, run_study, storage_url

DEVICE = DeviceInfo(device="cpu", model_max_len=2048, min_model_len=100)


def space(tmp_path: Path, tensor_parallel_size: int = 1):
    path = tmp_path / "space.json"
    path.write_text('{"max_num_seqs": {"choices": [1, 2, 4, 8]}, "block_size": {"fixed": 16},'
                    '"max_num_batched_tokens": {"fixed": 2048}, "enable_chunked_prefill": {"fixed": true},'
                    '"enable_prefix_caching": {"fixed": true}, "gpu_memory_utilization": {"fixed": 0.9},'
                    f'"tensor_parallel_size": {{"fixed": {tensor_parallel_size}}},'
                    '"max_model_len": null, "speculative_config": null}')  # fmt: skip
    return build_space(DEVICE, path)


def capacity(knobs: dict) -> float:
    return float(knobs["max_num_seqs"])


def test_simulate_first_launches_only_promising_configurations(tmp_path: Path) -> None:
    real, simulated = FakeBackend(capacity), FakeBackend(lambda k: capacity(k) * 1.1)  # a 10 % optimistic model
    spec = ObjectiveSpec(max_load=16)
    study = open_study(storage_url(None, tmp_path), "sf", spec, seed=0, info={})
    for seqs in (8, 1, 2, 4):
        study.enqueue_trial({"max_num_seqs": seqs})
    objective = SimulateFirstObjective(space(tmp_path), spec, real, tmp_path, simulator=simulated, margin=0.2)
    run_study(study, objective, 4, None, show_progress=False)
    trials = {t.params["max_num_seqs"]: t for t in study.get_trials()}
    # 8 is launched first (nothing measured yet); 1, 2 and 4 are predicted 1.1, 2.2, 4.4 < 0.8 * 8: pruned
    assert [k["max_num_seqs"] for k in real.launched] == [8]
    assert [k["max_num_seqs"] for k in simulated.launched] == [8, 1, 2, 4]
    for seqs in (1, 2, 4):
        assert trials[seqs].state == TrialState.PRUNED and trials[seqs].user_attrs["status"] == PRUNED_STATUS
        assert "reference 8 (#0)" in trials[seqs].user_attrs["error"]
        assert trials[seqs].user_attrs["predicted_values"] == [float(seqs)]  # whole streams below 1.1 x seqs
    assert trials[8].values == [8.0] and trials[8].user_attrs["predicted_values"] == [8.0]
    assert best_trials(study)[0].params["max_num_seqs"] == 8


# The recorded replay's failure (docs/benchmarks-history.md, run 2), x4: #4 is measured first (6.4, predicted 4.0: the
# simulation 1.6x pessimistic there); #8, the best (7.2), sits on a TTFT step in its nominal simulation (2.8) and
# clears it with faster steps (4.4); #1 is hopeless either way. The old rule (prediction against the best
# measured) pruned #8: 2.8 < 0.8 x 6.4.
REAL = {4: 6.4, 8: 7.2, 1: 1.2}
NOMINAL = {4: 4.0, 8: 2.8, 1: 1.2}
OPTIMISTIC = {4: 5.0, 8: 4.4, 1: 1.6}


def _goodput_study(tmp_path: Path, name: str, optimistic: FakeBackend | None):
    real, simulated = FakeBackend(lambda k: REAL[k["max_num_seqs"]]), FakeBackend(lambda k: NOMINAL[k["max_num_seqs"]])
    spec = ObjectiveSpec(kind="goodput", load=8)
    (tmp_path / name).mkdir()
    study = open_study(storage_url(None, tmp_path / name), name, spec, seed=0, info={})
    for seqs in (4, 8, 1):
        study.enqueue_trial({"max_num_seqs": seqs})
    objective = SimulateFirstObjective(space(tmp_path), spec, real, tmp_path / name, simulator=simulated,
                                       margin=0.2, optimistic=optimistic, step_error=0.38)  # fmt: skip
    run_study(study, objective, 3, None, show_progress=False)
    return study, real, simulated


def test_a_step_in_the_prediction_does_not_prune_the_best(tmp_path: Path) -> None:
    optimistic = FakeBackend(lambda k: OPTIMISTIC[k["max_num_seqs"]])
    study, real, simulated = _goodput_study(tmp_path, "step", optimistic)
    # reference: #4's prediction 4.0 (below its measured 6.4), threshold 3.2; #8: 2.8 < 3.2, but 4.4 with faster
    # steps: launched
    assert [k["max_num_seqs"] for k in real.launched] == [4, 8]
    assert [k["max_num_seqs"] for k in simulated.launched] == [4, 8, 1]
    assert [k["max_num_seqs"] for k in optimistic.launched] == [8, 1]  # only where the prediction alone prunes
    trials = {t.params["max_num_seqs"]: t for t in study.get_trials()}
    assert best_trials(study)[0].params["max_num_seqs"] == 8 and trials[8].values == [7.2]
    reference = {"trial": 0, "measured": 6.4, "predicted": 4.0, "value": 4.0}
    first = trials[4].user_attrs["prune_decision"]
    assert first["decision"] == "launch" and first["reference"] is None and first["optimistic"] is None
    best = trials[8].user_attrs["prune_decision"]
    assert best == {"decision": "launch", "predicted": 2.8, "optimistic": 4.4, "reference": reference,
                    "margin": 0.2, "step_error": 0.38, "reason": best["reason"]}
    assert "2.8 < reference 4 (#0) by more than 20%" in best["reason"] and "38% faster" in best["reason"]
    hopeless = trials[1]
    assert hopeless.state == TrialState.PRUNED and hopeless.user_attrs["status"] == PRUNED_STATUS
    decision = hopeless.user_attrs["prune_decision"]
    assert (decision["decision"], decision["predicted"], decision["optimistic"]) == ("prune", 1.2, 1.6)
    # #8 is now the best measured (7.2, predicted 2.8): the reference is 2.8, threshold 2.24
    assert decision["reference"] == {"trial": 1, "measured": 7.2, "predicted": 2.8, "value": 2.8}
    assert "1.6 < reference 2.8 (#1)" in hopeless.user_attrs["error"]


def test_without_the_optimistic_simulation_the_step_still_prunes(tmp_path: Path) -> None:
    """Comparing like with like alone (4.0 x 0.8 = 3.2) does not clear the 2.8 step: the optimistic bound is needed."""
    study, real, _ = _goodput_study(tmp_path, "nominal", None)
    assert [k["max_num_seqs"] for k in real.launched] == [4]
    pruned = {t.params["max_num_seqs"]: t.user_attrs["prune_decision"] for t in study.get_trials()
              if t.state == TrialState.PRUNED}  # fmt: skip
    assert sorted(pruned) == [1, 8] and pruned[8]["optimistic"] is None and pruned[8]["reference"]["value"] == 4.0


def test_missing_attainment_is_timing_and_gets_the_faster_simulation_but_a_refused_configuration_does_not(
    tmp_path: Path,
) -> None:
    def refused(knobs: dict) -> bool:
        return knobs["max_num_seqs"] == 2

    real = FakeBackend(capacity)
    simulated = FakeBackend(lambda k: 0.5, cannot_start=refused)  # misses the SLO at load 1
    optimistic = FakeBackend(lambda k: 1.0, cannot_start=refused)  # passes it with faster steps
    spec = ObjectiveSpec(max_load=16)
    study = open_study(storage_url(None, tmp_path), "sf5", spec, seed=0, info={})
    for seqs in (1, 2):
        study.enqueue_trial({"max_num_seqs": seqs})
    objective = SimulateFirstObjective(space(tmp_path), spec, real, tmp_path, simulator=simulated,
                                       optimistic=optimistic, step_error=0.5)  # fmt: skip
    run_study(study, objective, 2, None, show_progress=False)
    assert [k["max_num_seqs"] for k in real.launched] == [1]
    assert [k["max_num_seqs"] for k in optimistic.launched] == [1]  # the refused one is not simulated again
    first, second = study.get_trials()
    assert first.state == TrialState.COMPLETE and first.user_attrs["prune_decision"]["optimistic"] == 1.0
    assert "misses attainment" in first.user_attrs["prune_decision"]["reason"]
    assert second.state == TrialState.PRUNED and second.user_attrs["error"].startswith("predicted infeasible")
    assert second.user_attrs["prune_decision"]["decision"] == "prune"


def test_a_prediction_close_to_the_best_is_launched_and_a_hopeless_one_is_not(tmp_path: Path) -> None:
    real = FakeBackend(capacity)
    simulated = FakeBackend(lambda k: 0.5 if k["max_num_seqs"] == 1 else capacity(k))  # misses the SLO at load 1
    spec = ObjectiveSpec(max_load=16)
    study = open_study(storage_url(None, tmp_path), "sf2", spec, seed=0, info={})
    for seqs in (4, 8, 1):
        study.enqueue_trial({"max_num_seqs": seqs})
    objective = SimulateFirstObjective(space(tmp_path), spec, real, tmp_path, simulator=simulated, margin=0.2)
    run_study(study, objective, 3, None, show_progress=False)
    assert [k["max_num_seqs"] for k in real.launched] == [4, 8]  # 8 beats the best (4): launched
    pruned = [t for t in study.get_trials() if t.state == TrialState.PRUNED]
    assert [t.params["max_num_seqs"] for t in pruned] == [1] and "misses attainment" in pruned[0].user_attrs["error"]


def test_simulate_first_refuses_pareto_and_a_bad_margin(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="single objective"):
        SimulateFirstObjective(space(tmp_path), ObjectiveSpec(kind="pareto"), FakeBackend(capacity), tmp_path,
                               simulator=FakeBackend(capacity))  # fmt: skip
    with pytest.raises(ValueError, match="prune-margin"):
        SimulateFirstObjective(space(tmp_path), ObjectiveSpec(), FakeBackend(capacity), tmp_path,
                               simulator=FakeBackend(capacity), margin=1.5)  # fmt: skip


def test_cost_objective_minimises_the_priced_point() -> None:
    spec = ObjectiveSpec(kind="cost", load=4)
    assert spec.directions == ["minimize"] and spec.metric_names == ["cost_per_million_output_tokens"]
    priced = {"cost_per_hour": 2.0, "cost_per_million_output_tokens": 12.5, "slo_attainment": 1.0}
    assert fixed_load_evaluation(spec, priced).values == [12.5]
    assert fixed_load_evaluation(spec, {**priced, "cost_per_million_output_tokens": None}).values == [NO_COST]
    with pytest.raises(ValueError, match="--cost-per-hour"):
        fixed_load_evaluation(spec, {"slo_attainment": 1.0})


def test_simulated_backend_measures_with_the_real_scheduler(tmp_path: Path) -> None:
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({
        "kind": "servelab-step-profile", "knobs": {"model": "tiny-random"}, "kv_cache": {"tokens": 4096},
        "cost_model": {"coefficients": {"overhead": 0.01, "tokens": 0.001}},
    }))  # fmt: skip
    workload = TrialWorkload(model="tiny-random", input_len=16, output_len=4, num_prompts=4,
                             slo={"ttft_ms": 1000.0}, cost_per_hour=1.0)  # fmt: skip
    backend = SimulatedBackend(load_profile(profile), workload)
    with backend.launch({"max_num_seqs": 2, "max_model_len": 128}, tmp_path / "t0") as for_repeat:
        point = for_repeat(0)(4)
    assert point["simulated"] and point["completed"] == 4 and point["cost_source"] == "simulated"
    assert point["simulation"]["max_running_seqs"] == 2
    with pytest.raises(Infeasible, match="simulation"):
        knobs = {"enable_chunked_prefill": False, "max_num_batched_tokens": 64, "max_model_len": 128}
        with backend.launch(knobs, tmp_path / "t1") as for_repeat:
            for_repeat(0)(1)


def test_tune_command_checks_the_profile_and_the_price_before_any_trial(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cli import app

    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"kind": "servelab-step-profile", "knobs": {"model": "smollm2-135m"},
                                   "cost_model": {"coefficients": {"overhead": 0.01}}}))  # fmt: skip
    base = ["tune", "--model", "tiny-random", "--slo", "ttft=500", "--output-dir", str(tmp_path / "out")]
    result = CliRunner().invoke(app, [*base, "--simulate-first", str(profile)])
    assert result.exit_code == 2 and "profiles smollm2-135m, not tiny-random" in result.output
    result = CliRunner().invoke(app, [*base, "--objective", "cost"])
    assert result.exit_code == 2 and "needs --cost-per-hour" in result.output
    assert not (tmp_path / "out" / "tune.db").exists()


def test_a_configuration_the_profile_did_not_measure_is_launched_unpredicted(tmp_path: Path) -> None:
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({
        "kind": "servelab-step-profile", "knobs": {"model": "tiny-random", "tensor_parallel_size": 1},
        "kv_cache": {"tokens": 4096}, "cost_model": {"coefficients": {"overhead": 0.01}},
    }))  # fmt: skip
    simulator = SimulatedBackend(load_profile(profile), TrialWorkload(model="tiny-random", input_len=16, output_len=4))
    with pytest.raises(Unpredictable, match="tensor_parallel_size=1"):
        with simulator.launch({"tensor_parallel_size": 2}, tmp_path / "t"):
            pass
    real = FakeBackend(capacity)
    spec = ObjectiveSpec(max_load=16)
    study = open_study(storage_url(None, tmp_path), "sf3", spec, seed=0, info={})
    study.enqueue_trial({"max_num_seqs": 2})
    objective = SimulateFirstObjective(space(tmp_path, tensor_parallel_size=2), spec, real, tmp_path,
                                       simulator=simulator)  # fmt: skip
    run_study(study, objective, 1, None, show_progress=False)
    (trial,) = study.get_trials()
    assert real.launched and trial.state == TrialState.COMPLETE and trial.user_attrs["prediction"].startswith("none")


def test_speculative_configurations_are_launched_unpredicted(tmp_path: Path) -> None:
    """The simulator does not model speculative decoding: such a configuration is never pruned on its prediction."""
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({
        "kind": "servelab-step-profile", "knobs": {"model": "tiny-random"}, "kv_cache": {"tokens": 4096},
        "cost_model": {"coefficients": {"overhead": 0.01}},
    }))  # fmt: skip
    simulator = SimulatedBackend(load_profile(profile), TrialWorkload(model="tiny-random", input_len=16, output_len=4))
    ngram = '{"method": "ngram", "num_speculative_tokens": 4}'
    with pytest.raises(Unpredictable, match="does not model speculative decoding"):
        with simulator.launch({"speculative_config": ngram}, tmp_path / "t"):
            pass
    path = tmp_path / "space.json"
    path.write_text(
        json.dumps(
            {
                "max_num_seqs": {"fixed": 2},
                "speculative_config.num_speculative_tokens": 4,
                "enable_prefix_caching": None,
                "max_num_batched_tokens": None,
                "block_size": None,
                "enable_chunked_prefill": None,
                "max_model_len": None,
                "tensor_parallel_size": None,
            }
        )
    )
    real = FakeBackend(capacity)
    spec = ObjectiveSpec(max_load=16)
    study = open_study(storage_url(None, tmp_path), "sf4", spec, seed=0, info={})
    objective = SimulateFirstObjective(build_space(DEVICE, path), spec, real, tmp_path, simulator=simulator)
    run_study(study, objective, 1, None, show_progress=False)
    (trial,) = study.get_trials()
    assert [k["speculative_config"] for k in real.launched] == [ngram]
    assert trial.state == TrialState.COMPLETE and "does not model speculative" in trial.user_attrs["prediction"]


def test_the_optimistic_simulation_runs_every_step_faster_by_the_profiles_error(tmp_path: Path) -> None:
    from engine.executor.cost_model import StepShape

    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({
        "kind": "servelab-step-profile", "knobs": {"model": "tiny-random"}, "kv_cache": {"tokens": 4096},
        "cost_model": {"coefficients": {"overhead": 0.01, "tokens": 0.001}, "serving": {"per_seq": 0.002},
                       "fit_error": {"max_rel_error": 0.1, "loo_max_rel_error": 0.25}},
    }))  # fmt: skip
    loaded = load_profile(profile)
    assert profile_step_error(loaded) == 0.25 == resolve_step_error("profile", loaded)
    assert resolve_step_error("0", loaded) == 0.0 and resolve_step_error("0.5", loaded) == 0.5
    for bad in ("-0.1", "nan", "inf", "fast"):
        with pytest.raises(ValueError, match="--prune-step-error must be 'profile' or a relative step-time error"):
            resolve_step_error(bad, loaded)
    loaded.cost_model.fit_error.pop("loo_max_rel_error")
    assert profile_step_error(loaded) == 0.1  # too few steps for leave-one-out: the in-sample max
    workload = TrialWorkload(model="tiny-random", input_len=16, output_len=4, num_prompts=4, slo={"ttft_ms": 1000.0})
    nominal, fast = simulators(load_profile(profile), workload, 0.25)
    assert fast is not None and simulators(load_profile(profile), workload, 0.0)[1] is None
    shape = StepShape(num_prefill_tokens=16, num_decode_seqs=3, decode_context_tokens=60, num_prefill_seqs=1)
    assert fast.profile.cost_model.step_time(shape) == pytest.approx(nominal.profile.cost_model.step_time(shape) / 1.25)
    points = {}
    for name, backend in (("nominal", nominal), ("fast", fast)):
        with backend.launch({"max_num_seqs": 2, "max_model_len": 128}, tmp_path / "t0") as for_repeat:
            points[name] = for_repeat(0)(4)
    assert points["fast"]["median_ttft_ms"] < points["nominal"]["median_ttft_ms"]
    assert points["fast"]["request_throughput"] > points["nominal"]["request_throughput"]
    assert (tmp_path / "t0" / "simulated").is_dir() and (tmp_path / "t0" / "simulated_optimistic").is_dir()


def test_tune_command_refuses_a_bad_step_error_and_keeps_the_prune_settings(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cli import app

    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"kind": "servelab-step-profile", "knobs": {"model": "tiny-random"},
                                   "cost_model": {"coefficients": {"overhead": 0.01},
                                                  "fit_error": {"loo_max_rel_error": 0.3}}}))  # fmt: skip
    base = ["tune", "--model", "tiny-random", "--slo", "ttft=500", "--output-dir", str(tmp_path / "out"),
            "--simulate-first", str(profile)]
    result = CliRunner().invoke(app, [*base, "--prune-step-error", "-0.2"])
    assert result.exit_code == 2 and "--prune-step-error must be 'profile'" in result.output
    assert not (tmp_path / "out" / "tune.db").exists()
    result = CliRunner().invoke(app, [*base, "--n-trials", "0", "--prune-margin", "0.1"])  # the settings, no trial
    assert result.exit_code == 0, result.output
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{tmp_path / 'out' / 'tune.db'}")
    assert {k: study.user_attrs[k] for k in ("simulate_first", "prune_margin", "prune_step_error")} == {
        "simulate_first": str(profile), "prune_margin": 0.1, "prune_step_error": 0.3}
