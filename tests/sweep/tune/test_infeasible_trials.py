"""Trials whose engine crashes, runs out of memory or hangs past the trial timeout are recorded infeasible with the
cause and the reason, and the study goes on: real processes (fake_engine.py) under the tuner's own launcher."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import optuna
from optuna.trial import TrialState

from sweep.tune.backend import ENGINE_PID, EngineBackend, TrialWorkload
from sweep.tune.objective import ObjectiveSpec
from sweep.tune.report import write_report
from sweep.tune.space import DeviceInfo, build_space
from sweep.tune.study import TuneObjective, feasible, open_study, run_study, storage_url

FAKE_ENGINE = Path(__file__).with_name("fake_engine.py")
TEMPLATE = (f"{shlex.quote(sys.executable)} {shlex.quote(str(FAKE_ENGINE))} --port {{port}} "
            "--max-num-seqs {max_num_seqs} --faults 3=crash,5=oom,7=hang,9=oomkill")  # fmt: skip
NOT_SEARCHED = dict.fromkeys(["enable_prefix_caching", "max_num_batched_tokens", "enable_chunked_prefill",
                              "max_model_len", "block_size", "tensor_parallel_size", "speculative_config"])  # fmt: skip


def run_grid(tmp_path: Path, seqs: list[int], trial_timeout_s: float | None) -> optuna.Study:
    space_file = tmp_path / "space.json"
    space_file.write_text(json.dumps({"max_num_seqs": {"choices": seqs}, **NOT_SEARCHED}))
    space = build_space(DeviceInfo(), space_file)
    spec = ObjectiveSpec(kind="goodput", attainment=0.5, load=2)
    workload = TrialWorkload(model="mock", tokenizer="tiny-random", workload="fixed", input_len=8, output_len=8,
                             num_prompts=4, num_warmups=0, slo={"ttft_ms": 5000.0})  # fmt: skip
    backend = EngineBackend(workload, launch_command=TEMPLATE, startup_timeout_s=60, trial_timeout_s=trial_timeout_s)
    study = open_study(storage_url(None, tmp_path), "faults", spec, seed=0, info={}, grid=space.grid())
    run_study(study, TuneObjective(space, spec, backend, tmp_path), len(seqs), None, show_progress=False)
    return study


def test_crashed_and_out_of_memory_engines_make_infeasible_trials_and_the_study_goes_on(tmp_path: Path) -> None:
    study = run_grid(tmp_path, [1, 3, 5, 9], trial_timeout_s=None)
    by_seqs = {t.params["max_num_seqs"]: t for t in study.trials}
    assert sorted(by_seqs) == [1, 3, 5, 9] and all(t.state == TrialState.COMPLETE for t in study.trials)
    ok = by_seqs[1]
    assert ok.user_attrs["status"] == "ok" and feasible(ok) and ok.values[0] > 0
    expected = {3: ("crash", "crashed (exit code 1)"), 5: ("oom", "ran out of memory (exit code 1)"),
                9: ("oom", "ran out of memory (exit code -9)")}  # fmt: skip
    for seqs, (cause, words) in expected.items():
        trial = by_seqs[seqs]
        assert trial.user_attrs["status"] == "infeasible" and not feasible(trial) and trial.values == [0.0]
        assert trial.user_attrs["cause"] == cause and words in trial.user_attrs["error"], trial.user_attrs["error"]
        run_dir = Path(trial.user_attrs["run_dir"])
        assert not (run_dir / ENGINE_PID).exists()
        assert json.loads((run_dir / "repeat0" / "points" / "c0002.json").read_text())["failed"] > 0
    oom_line = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"  # the engine's own words
    assert by_seqs[5].user_attrs["engine_error"] == oom_line and by_seqs[5].user_attrs["error"].startswith(oom_line)
    page = write_report(study, tmp_path, []).read_text()
    assert "infeasible (crash)" in page and "infeasible (oom)" in page


def test_an_engine_hanging_past_the_trial_timeout_is_killed_and_the_trial_infeasible(tmp_path: Path) -> None:
    study = run_grid(tmp_path, [7], trial_timeout_s=2.0)
    (trial,) = study.trials
    assert trial.state == TrialState.COMPLETE and trial.user_attrs["status"] == "infeasible"
    assert trial.user_attrs["cause"] == "timeout" and "--trial-timeout 2 s" in trial.user_attrs["error"]
    assert f"log {Path(trial.user_attrs['run_dir']) / 'server.log'}" in trial.user_attrs["error"]
