"""--simulate-first: predicted-hopeless configurations are pruned unlaunched; --objective cost minimises price."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from optuna.trial import TrialState
from tune_fakes import FakeBackend

from sweep.simulate_run import load_profile
from sweep.tune.backend import TrialWorkload
from sweep.tune.objective import NO_COST, Infeasible, ObjectiveSpec, fixed_load_evaluation
from sweep.tune.simulate_first import PRUNED_STATUS, SimulatedBackend, SimulateFirstObjective, Unpredictable
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
        assert "best measured 8" in trials[seqs].user_attrs["error"]
        assert trials[seqs].user_attrs["predicted_values"] == [float(seqs)]  # whole streams below 1.1 x seqs
    assert trials[8].values == [8.0] and trials[8].user_attrs["predicted_values"] == [8.0]
    assert best_trials(study)[0].params["max_num_seqs"] == 8


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
    assert [t.params["max_num_seqs"] for t in pruned] == [1] and "miss attainment" in pruned[0].user_attrs["error"]


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
