"""The study machinery with a fake engine: trial accounting, infeasible and pruned trials, resume, PostgreSQL."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from tune_fakes import FakeBackend

from sweep.tune.objective import ObjectiveSpec
from sweep.tune.space import DeviceInfo, build_space
from sweep.tune.study import (
    TuneAborted,
    TuneObjective,
    best_trials,
    feasible,
    open_study,
    run_study,
    storage_url,
    worker_identity,
)

REPO = Path(__file__).resolve().parents[3]
DEVICE = DeviceInfo(device="cpu", model_max_len=2048, min_model_len=100)


def small_space(tmp_path: Path):
    path = tmp_path / "space.json"
    path.write_text('{"max_num_seqs": {"choices": [1, 2, 4, 8]}, "block_size": {"choices": [16, 32]},'
                    '"max_num_batched_tokens": {"fixed": 2048}, "enable_chunked_prefill": {"fixed": true},'
                    '"enable_prefix_caching": {"choices": [false, true]}, "max_model_len": null,'
                    '"speculative_config": null}')
    return build_space(DEVICE, path)


def capacity(knobs: dict) -> float:
    return knobs["max_num_seqs"] - 0.5 * (not knobs["enable_prefix_caching"])


def test_study_accounts_for_every_trial(tmp_path: Path) -> None:
    backend = FakeBackend(capacity, cannot_start=lambda k: k["block_size"] == 32 and k["max_num_seqs"] == 8)
    spec = ObjectiveSpec(max_load=16)
    study = open_study(storage_url(None, tmp_path), "t", spec, seed=1, info={"model": "fake"})
    study.enqueue_trial({"max_num_seqs": 8, "block_size": 32, "enable_prefix_caching": True})  # cannot start
    study.enqueue_trial({"max_num_seqs": 1, "block_size": 16, "enable_prefix_caching": False})  # misses at c=1
    run_study(study, TuneObjective(small_space(tmp_path), spec, backend, tmp_path, repeats=2), 12, None,
              show_progress=False)
    trials = study.get_trials()
    assert sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials) == 12
    assert [t.number for t in trials] == list(range(len(trials)))

    infeasible = trials[0]
    assert infeasible.state == TrialState.COMPLETE and not feasible(infeasible)
    assert infeasible.user_attrs["status"] == "infeasible" and "out of memory" in infeasible.user_attrs["error"]
    assert infeasible.values == [0.0] and infeasible.constraints["starts"] > 0

    pruned = trials[1]
    assert pruned.state == TrialState.PRUNED and pruned.user_attrs["status"] == "pruned"
    assert pruned.intermediate_values == {0: 0.0}  # stopped after the first load level

    for t in trials:
        assert t.user_attrs["run_dir"].endswith(f"trial_{t.number:04d}")
        assert t.user_attrs["knobs"]["max_num_batched_tokens"] == 2048  # pinned knobs travel with each trial
        if t.user_attrs["status"] == "ok":
            assert t.values == [max(0.0, float(int(capacity(t.params))))]
            assert t.user_attrs["metrics"]["slo_attainment"] == 1.0 and len(t.user_attrs["repeat_values"]) == 2
            assert t.user_attrs["spread"] == [0.0]
    best = best_trials(study)
    assert len(best) == 1 and best[0].values == [8.0] and feasible(best[0])


def test_pareto_study_returns_a_front(tmp_path: Path) -> None:
    spec = ObjectiveSpec(kind="pareto", load=4)
    study = open_study(storage_url(None, tmp_path), "p", spec, seed=0, info={})
    run_study(study, TuneObjective(small_space(tmp_path), spec, FakeBackend(capacity), tmp_path), 8, None,
              show_progress=False)
    front = best_trials(study)
    assert front and all(t.state == TrialState.COMPLETE for t in front)
    assert study.metric_names == ["request_goodput", "p90_ttft_ms"]


def test_a_dead_workers_trial_is_failed_and_rerun_with_the_same_parameters(tmp_path: Path) -> None:
    spec = ObjectiveSpec(max_load=16)
    study = open_study(storage_url(None, tmp_path), "r", spec, seed=0, info={})
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    params = {"max_num_seqs": 4, "block_size": 16, "enable_prefix_caching": True}
    study.enqueue_trial(params)
    trial = study.ask()
    small_space(tmp_path).suggest(trial)
    trial.set_user_attr("worker", {**worker_identity(), "pid": dead.pid, "start": "0"})
    run_study(study, TuneObjective(small_space(tmp_path), spec, FakeBackend(capacity), tmp_path), 3, None,
              show_progress=False)
    trials = study.get_trials()
    assert trials[0].state == TrialState.FAIL and "died mid-trial" in trials[0].user_attrs["error"]
    assert trials[1].params == params and trials[1].state == TrialState.COMPLETE
    assert trials[1].system_attrs["failed_trial"] == 0
    assert sum(t.state == TrialState.COMPLETE for t in trials) == 3


def test_repeated_unexpected_errors_stop_the_worker(tmp_path: Path) -> None:
    spec = ObjectiveSpec()
    study = open_study(storage_url(None, tmp_path), "e", spec, seed=0, info={})
    broken = FakeBackend(lambda knobs: 1 / 0)
    with pytest.raises(TuneAborted, match="ZeroDivisionError"):
        run_study(study, TuneObjective(small_space(tmp_path), spec, broken, tmp_path), 10, None, show_progress=False)
    assert len(study.trials) == 3 and all(t.state == TrialState.FAIL for t in study.trials)


WORKER = textwrap.dedent("""
    import os
    import sys
    import time
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from tune_fakes import FakeBackend
    from sweep.tune.objective import ObjectiveSpec
    from sweep.tune.space import DeviceInfo, build_space
    from sweep.tune.study import TuneObjective, open_study, run_study

    out = Path(sys.argv[2])
    device = DeviceInfo(device="cpu", model_max_len=2048, min_model_len=100)
    space = build_space(device, out / "space.json")
    spec = ObjectiveSpec(max_load=16)
    study = open_study(sys.argv[1], "shared", spec, seed=0, info={{}})
    capacity = lambda k: k["max_num_seqs"] - 0.5 * (not k["enable_prefix_caching"])
    # start together (a barrier on files), and make trials last, so both workers really share the study
    (out / f"ready-{{os.getpid()}}").touch()
    deadline = time.monotonic() + 120
    while len(list(out.glob("ready-*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    backend = FakeBackend(capacity)
    measure_slowly = backend.launch
    def launch(knobs, trial_dir):
        time.sleep(0.2)
        return measure_slowly(knobs, trial_dir)
    backend.launch = launch
    run_study(study, TuneObjective(space, spec, backend, out), 10, None, show_progress=False)
""")


def test_two_workers_share_one_postgresql_study(tmp_path: Path, postgres_dsn: str) -> None:
    small_space(tmp_path)  # writes space.json for the workers
    with contextlib.suppress(KeyError):  # a study left by an interrupted earlier run on the same server
        optuna.delete_study(study_name="shared", storage=postgres_dsn)
    script = WORKER.format(tests=str(Path(__file__).parent))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    workers = [subprocess.Popen([sys.executable, "-c", script, postgres_dsn, str(tmp_path)], env=env,
                                stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for worker in workers:
        _, err = worker.communicate(timeout=300)
        assert worker.returncode == 0, err
    study = optuna.load_study(study_name="shared", storage=postgres_dsn)
    trials = study.get_trials()
    numbers = [t.number for t in trials]
    assert sorted(numbers) == list(range(len(trials)))  # no duplicated or missing numbers
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)  # every trial accounted for
    assert 10 <= len(trials) <= 11  # at most one trial of overshoot when both workers start the last one
    pids = {t.user_attrs["worker"]["pid"] for t in trials}
    assert len(pids) == 2  # both workers ran trials
    optuna.delete_study(study_name="shared", storage=postgres_dsn)


def test_a_study_refuses_a_changed_search_space(tmp_path: Path) -> None:
    from sweep.tune.study import check_space_matches

    spec = ObjectiveSpec(max_load=16)
    study = open_study(storage_url(None, tmp_path), "s", spec, seed=0, info={})
    space = small_space(tmp_path)
    run_study(study, TuneObjective(space, spec, FakeBackend(capacity), tmp_path), 2, None, show_progress=False)
    check_space_matches(study, space)  # the same space resumes
    space.knobs[0].choices = [1, 2]
    with pytest.raises(ValueError, match="max_num_seqs.*use the original --space"):
        check_space_matches(study, space)
    space.knobs.pop()
    with pytest.raises(ValueError, match="searches"):
        check_space_matches(study, space)


def test_progress_shows_trials_done_the_best_so_far_and_time_left(tmp_path: Path, capsys) -> None:
    spec = ObjectiveSpec(max_load=16)
    study = open_study(storage_url(None, tmp_path), "progress", spec, seed=0, info={})
    study.enqueue_trial({"max_num_seqs": 4, "block_size": 16, "enable_prefix_caching": True})
    run_study(study, TuneObjective(small_space(tmp_path), spec, FakeBackend(capacity), tmp_path), 3, None)
    shown = " ".join(capsys.readouterr().out.split())
    best = best_trials(study)[0]
    assert "3/3" in shown and f"best {best.values[0]:.4g} (#{best.number})" in shown and "~0s left" in shown


def test_timeout_stops_starting_trials(tmp_path: Path) -> None:
    class SlowBackend(FakeBackend):
        @contextlib.contextmanager
        def launch(self, knobs: dict, trial_dir: Path):
            import time

            time.sleep(0.2)  # each trial takes at least this long: 100 trials would take 20 s
            with super().launch(knobs, trial_dir) as for_repeat:
                yield for_repeat

    spec = ObjectiveSpec(max_load=16)
    study = open_study(storage_url(None, tmp_path), "timeout", spec, seed=0, info={})
    run_study(study, TuneObjective(small_space(tmp_path), spec, SlowBackend(capacity), tmp_path), 100, 0.5,
              show_progress=False)
    trials = study.get_trials()
    assert 1 <= len(trials) < 100 and all(t.state != TrialState.RUNNING for t in trials)
