"""`bench tune` end to end on tiny-random: real `bench serve` engines, real load points, real storages."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from sweep.tune.backend import process_start

BENCH = str(Path(sys.executable).with_name("bench"))
SPACE = {"max_num_seqs": {"choices": [1, 2, 4]}, "enable_prefix_caching": {"choices": [False, True]},
         "max_num_batched_tokens": {"fixed": 256}, "enable_chunked_prefill": {"fixed": True},
         "max_model_len": {"fixed": 128}, "block_size": {"fixed": 16}}


def tune_command(out: Path, n_trials: int, space: dict | None = None, *extra: str) -> list[str]:
    space_file = out.parent / f"{out.name}-space.json"
    space_file.write_text(json.dumps(space or SPACE))
    return [BENCH, "tune", "--model", "tiny-random", "--slo", "ttft=5000,tpot=2000", "--n-trials", str(n_trials),
            "--space", str(space_file), "--output-dir", str(out), "--input-len", "16", "--output-len", "4",
            "--num-prompts", "2", "--num-warmups", "0", "--max-load", "2", "--startup-timeout", "180", *extra]


def load_study(out: Path) -> optuna.Study:
    (name,) = optuna.get_all_study_names(f"sqlite:///{out / 'tune.db'}")
    return optuna.load_study(study_name=name, storage=f"sqlite:///{out / 'tune.db'}")


def finished(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.get_trials() if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]


# Seed 1's first draws in SPACE (TPE's random start, whatever the results): (max_num_seqs, K, tensor_parallel_size,
# prefix caching) = (2, 0, 1, on), (4, 2, 2, on): speculation off and on, a one- and a two-process engine.
SEED = "1"


@pytest.mark.slow
def test_two_trial_study_writes_runs_best_command_and_report(tmp_path: Path) -> None:
    out = tmp_path / "study"
    done = subprocess.run(tune_command(out, 2, None, "--seed", SEED), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    study = load_study(out)
    assert len(finished(study)) == 2 and len(study.trials) == 2
    depths = {t.params["speculative_config.num_speculative_tokens"] > 0 for t in study.trials}
    assert depths == {False, True}, "the draws must assemble a speculative_config and leave it off"
    best = json.loads((out / "best.json").read_text())
    assert best and best[0]["serve_command"].startswith("bench serve tiny-random ")
    assert "--max-num-seqs" in best[0]["serve_command"]
    assert best[0]["serve_command"] in " ".join(done.stdout.split())
    for trial in study.trials:
        run_dir = Path(trial.user_attrs["run_dir"])
        assert (run_dir / "server.log").exists()
        if trial.state == TrialState.COMPLETE:
            config = json.loads((run_dir / "repeat0" / "config.json").read_text())
            assert config["target"]["engine_knobs"]["max_num_seqs"] == trial.params["max_num_seqs"]
            speculative = config["target"]["engine_knobs"]["speculative_config"]  # assembled from its fields
            depth = json.loads(speculative)["num_speculative_tokens"] if speculative else 0
            assert depth == trial.params["speculative_config.num_speculative_tokens"]
            points = sorted((run_dir / "repeat0" / "points").glob("*.json"))
            assert points and trial.user_attrs["metrics"]["completed"] == 2
    page = (out / "tune_report.html").read_text()
    assert "Optimisation history" in page and "data:image/png;base64," in page


@pytest.mark.slow
def test_a_study_killed_mid_trial_resumes_with_the_same_command(tmp_path: Path) -> None:
    out = tmp_path / "study"
    command = tune_command(out, 1, None, "--seed", SEED)  # trial 0: one engine process, no speculation
    tuner = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pid_file = out / "trials" / "trial_0000" / "engine.pid"
    measured = out / "trials" / "trial_0000" / "repeat0" / "config.json"  # written once the engine is healthy
    deadline = time.monotonic() + 600
    while not measured.exists() and tuner.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pid_file.exists() and measured.exists(), "the first trial never started its engine"
    engine = json.loads(pid_file.read_text())
    tuner.send_signal(signal.SIGKILL)  # mid-trial: the engine is up and being measured
    tuner.wait()
    assert process_start(engine["pid"]) == engine["start"]  # the orphan engine is still alive ...

    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert process_start(engine["pid"]) != engine["start"]  # ... until the resumed study ends it
    study = load_study(out)
    assert len(finished(study)) == 1  # the killed trial does not count: its retry finishes the study
    killed = study.trials[0]
    assert killed.state == TrialState.FAIL and "died mid-trial" in killed.user_attrs["error"]
    retry = next(t for t in study.trials if t.system_attrs.get("failed_trial") == 0)
    assert retry.params == killed.params and retry.state in (TrialState.COMPLETE, TrialState.PRUNED)


@pytest.mark.slow
def test_a_configuration_that_cannot_start_is_recorded_infeasible(tmp_path: Path) -> None:
    out = tmp_path / "study"
    space = {**SPACE, "max_num_seqs": {"fixed": 2}, "block_size": {"fixed": 24}}  # 24: the engine refuses to start
    done = subprocess.run(tune_command(out, 1, space), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no feasible configuration" in done.stdout
    (trial,) = load_study(out).trials
    assert trial.state == TrialState.COMPLETE and trial.values == [0.0]
    assert trial.user_attrs["status"] == "infeasible" and trial.constraints["starts"] > 0
    assert "block_size must be a positive power of two" in trial.user_attrs["error"]


@pytest.mark.slow
def test_two_tune_workers_share_one_postgresql_study(tmp_path: Path, postgres_dsn: str) -> None:
    extra = ("--storage", postgres_dsn, "--study-name", "e2e-shared")
    with contextlib.suppress(KeyError):  # a study left by an interrupted earlier run on the same server
        optuna.delete_study(study_name="e2e-shared", storage=postgres_dsn)
    # The shared storage is what is tested (the real engine's trials are above): each trial launches the mock.
    space = {**MOCK_SPACE, "max_num_seqs": {"choices": [1, 2, 4]}}
    template = f"{sys.executable} -m sweep.mock.server --port {{port}} --ttft-ms 5 --itl-ms 1"
    extra += ("--tokenizer", "tiny-random", "--launch-command", template)
    workers = [subprocess.Popen(tune_command(tmp_path / f"w{i}", 3, space, *extra), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "200"})
               for i in range(2)]
    for worker in workers:
        output, _ = worker.communicate(timeout=900)
        assert worker.returncode == 0, output
    study = optuna.load_study(study_name="e2e-shared", storage=postgres_dsn)
    trials = study.get_trials()
    assert sorted(t.number for t in trials) == list(range(len(trials)))
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    assert 3 <= len(trials) <= 4
    assert len({t.user_attrs["worker"]["pid"] for t in trials}) == 2
    dirs = {Path(t.user_attrs["run_dir"]).name for t in trials}
    assert len(dirs) == len(trials)  # each trial wrote its own run directory
    optuna.delete_study(study_name="e2e-shared", storage=postgres_dsn)


@pytest.mark.slow
def test_external_template_open_loop_repeats_and_pruning_against_the_mock(tmp_path: Path) -> None:
    """The mock streams with a gap of `max_num_seqs` ms per token: 32 misses tpot=15 at every rate (pruned)."""
    out = tmp_path / "study"
    space = {"max_num_seqs": {"choices": [2, 32]}, "enable_prefix_caching": None, "max_num_batched_tokens": None,
             "enable_chunked_prefill": None, "max_model_len": None, "block_size": None, "tensor_parallel_size": None,
             "speculative_config": None}
    template = f"{sys.executable} -m sweep.mock.server --port {{port}} --ttft-ms 5 --itl-ms {{max_num_seqs}}"
    command = [BENCH, "tune", "--model", "mock", "--tokenizer", "tiny-random", "--slo", "tpot=15",
               "--attainment", "0.5", "--request-rate", "2", "--max-load", "8", "--repeats", "2", "--grid",
               "--space", str(out.parent / "space.json"), "--output-dir", str(out), "--input-len", "16",
               "--output-len", "8", "--num-prompts", "6", "--launch-command", template]
    (out.parent / "space.json").write_text(json.dumps(space))
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    study = load_study(out)
    by_seqs = {t.params["max_num_seqs"]: t for t in study.trials}
    assert set(by_seqs) == {2, 32} and len(study.trials) == 2  # the grid: each configuration once
    good, bad = by_seqs[2], by_seqs[32]
    assert good.state == TrialState.COMPLETE and good.values == [8.0] and good.user_attrs["spread"] == [0.0]
    assert len(good.user_attrs["repeat_values"]) == 2
    assert sorted(p.name for p in (Path(good.user_attrs["run_dir"]) / "repeat1" / "points").glob("*.json")) == [
        "r0002.00.json", "r0004.00.json", "r0008.00.json"]
    assert bad.state == TrialState.PRUNED and bad.intermediate_values == {0: 0.0}
    best = json.loads((out / "best.json").read_text())
    assert best[0]["launch_command"].endswith("--port 8000 --ttft-ms 5 --itl-ms 2")


MOCK_SPACE = {"max_num_seqs": {"fixed": 2}, "enable_prefix_caching": None, "max_num_batched_tokens": None,
              "enable_chunked_prefill": None, "max_model_len": None, "block_size": None, "tensor_parallel_size": None,
             "speculative_config": None}


@pytest.mark.slow
def test_a_shipped_mix_tunes_without_length_options(tmp_path: Path) -> None:
    """Shipped mixes bring their own lengths: the tuner passes none (workloads.load rejects them for a mix)."""
    out = tmp_path / "study"
    (tmp_path / "space.json").write_text(json.dumps(MOCK_SPACE))
    template = f"{sys.executable} -m sweep.mock.server --port {{port}} --ttft-ms 5 --itl-ms 1"
    command = [BENCH, "tune", "--model", "mock", "--tokenizer", "tiny-random", "--workload", "lmsys",
               "--slo", "tpot=500", "--objective", "goodput", "--concurrency", "2", "--n-trials", "1",
               "--space", str(tmp_path / "space.json"), "--output-dir", str(out), "--num-prompts", "3",
               "--num-warmups", "0", "--launch-command", template]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (trial,) = load_study(out).trials
    assert trial.state == TrialState.COMPLETE and trial.user_attrs["metrics"]["completed"] == 3
    config = json.loads((Path(trial.user_attrs["run_dir"]) / "repeat0" / "config.json").read_text())
    assert config["workload"]["workload"] == "lmsys"
    (best,) = json.loads((out / "best.json").read_text())  # the best trial's sweep report, linked from the page
    assert Path(best["sweep_report"]).name == "report.html" and Path(best["sweep_report"]).stat().st_size > 1000
    assert best["sweep_report"] in (out / "tune_report.html").read_text()


@pytest.mark.parametrize(("flags", "message"), [
    (["--workload", "lmsys", "--input-len", "100"], "takes no length options"),
    (["--workload", "no-such-mix"], "unknown workload 'no-such-mix'"),
    (["--launch-command", "vllm serve {model} --port {port} --max-num-seqs {max_num_sequences}"],
     "max_num_sequences"),
])
def test_a_bad_workload_or_template_is_one_clear_error_before_any_trial(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    done = subprocess.run([BENCH, "tune", "--model", "tiny-random", "--slo", "ttft=500", "--output-dir",
                           str(tmp_path / "study"), *flags], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stdout and "Traceback" not in done.stdout + done.stderr
    assert not (tmp_path / "study").exists()
