"""Chaos: `bench tune` SIGKILLed at random moments (four seeds, one study): every result file on disk parses, the
next run resumes from the finished trials (none lost), and no engine it launched is left running."""

from __future__ import annotations

import contextlib
import html.parser
import json
import os
import random
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

REPO = Path(__file__).resolve().parents[3]
FAKE_ENGINE = Path(__file__).with_name("fake_engine.py")
N_TRIALS = 4
SEEDS = (0, 2, 5, 7)  # their moments (below) fall in start-up, mid-trial and between trials
NOT_SEARCHED = dict.fromkeys(["enable_prefix_caching", "max_num_batched_tokens", "enable_chunked_prefill",
                              "max_model_len", "block_size", "tensor_parallel_size", "speculative_config"])  # fmt: skip


def tune(out: Path, pid_dir: Path) -> subprocess.Popen[str]:
    (out.parent / "space.json").write_text(json.dumps({"max_num_seqs": {"choices": [1, 2, 3]}, **NOT_SEARCHED}))
    template = (f"{shlex.quote(sys.executable)} {shlex.quote(str(FAKE_ENGINE))} --port {{port}} "
                f"--max-num-seqs {{max_num_seqs}} --faults 3=crash --pid-dir {shlex.quote(str(pid_dir))}")  # fmt: skip
    command = [sys.executable, "-m", "cli", "tune", "--model", "mock", "--tokenizer", "tiny-random",
               "--slo", "ttft=5000", "--objective", "goodput", "--concurrency", "2", "--n-trials", str(N_TRIALS),
               "--space", str(out.parent / "space.json"), "--output-dir", str(out), "--workload", "fixed",
               "--input-len", "8", "--output-len", "4", "--num-prompts", "4", "--num-warmups", "0",
               "--trial-timeout", "60", "--startup-timeout", "60", "--launch-command", template]  # fmt: skip
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, "COLUMNS": "200"})  # fmt: skip


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def engines_gone(pid_dir: Path, within_s: float = 30.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not any(alive(int(p.name)) for p in pid_dir.glob("*")):
            return True
        time.sleep(0.2)
    return False


def finished_trials(out: Path) -> dict[int, tuple[str, list[float] | None, dict]]:
    """Every file of the study parses; returns its finished trials: number -> (state, values, params)."""
    if (out / "best.json").exists():
        assert isinstance(json.loads((out / "best.json").read_text()), list)
    if (out / "tune_report.html").exists():
        page = (out / "tune_report.html").read_text()
        html.parser.HTMLParser().feed(page)
        assert page.rstrip().endswith("</html>")
    for path in out.glob("trials/*/engine.pid"):
        assert set(json.loads(path.read_text())) == {"pid", "start"}
    for run_dir in out.glob("trials/*/repeat*"):
        if (run_dir / "config.json").exists():
            json.loads((run_dir / "config.json").read_text())
        for point in (run_dir / "points").glob("*.json"):
            json.loads(point.read_text())
        if (run_dir / "requests.jsonl").exists():
            for line in (run_dir / "requests.jsonl").read_text().splitlines():
                json.loads(line)
    db = out / "tune.db"
    if not db.exists():
        return {}
    with sqlite3.connect(db) as connection:
        assert connection.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    names = optuna.get_all_study_names(f"sqlite:///{db}")
    if not names:
        return {}
    (name,) = names
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{db}")
    return {t.number: (t.state.name, t.values, t.params) for t in study.get_trials()
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED)}  # fmt: skip


@pytest.mark.slow
def test_tune_killed_at_random_moments_resumes_without_loss_or_orphans(tmp_path: Path) -> None:
    out, pid_dir = tmp_path / "study", tmp_path / "engines"
    finished_before: dict[int, tuple[str, list[float] | None, dict]] = {}
    for seed in SEEDS:  # each run resumes the study the last one was killed in
        rng = random.Random(seed)
        process = tune(out, pid_dir)
        # A moment tied to progress, not to the clock (the machine may be slow): 0-2 s after this run's k-th
        # engine start (k = 0: anywhere in its start-up, imports and resume included).
        launched = len(list(pid_dir.glob("*"))) + rng.randint(0, 2)
        deadline = time.monotonic() + 120
        while len(list(pid_dir.glob("*"))) < launched and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 2.0))
        with contextlib.suppress(ProcessLookupError):  # the run may have finished the study first
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        assert engines_gone(pid_dir), "an engine outlived the tuner that launched it"
        finished = finished_trials(out)
        assert finished.items() >= finished_before.items()  # a finished trial is never lost nor changed
        finished_before = finished
    final = tune(out, pid_dir)
    output = final.communicate(timeout=300)[0]
    assert final.returncode == 0, output[-3000:]
    assert engines_gone(pid_dir, within_s=5.0) and any(pid_dir.glob("*"))
    finished = finished_trials(out)
    assert len(finished) == N_TRIALS and finished.items() >= finished_before.items()
    (name,) = optuna.get_all_study_names(f"sqlite:///{out / 'tune.db'}")
    trials = optuna.load_study(study_name=name, storage=f"sqlite:///{out / 'tune.db'}").get_trials()
    assert not [t for t in trials if t.state == TrialState.RUNNING]  # a killed run's trial was failed on resume
    for trial in trials:
        if trial.state == TrialState.FAIL:
            assert "died mid-trial" in trial.user_attrs["error"]
        if trial.params.get("max_num_seqs") == 3 and trial.state == TrialState.COMPLETE:
            assert trial.user_attrs["cause"] == "crash"
    assert (out / "best.json").exists() and (out / "tune_report.html").exists()
