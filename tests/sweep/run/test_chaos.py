"""Chaos: `bench sweep` SIGKILLed at random moments (every file on disk parses, --resume finishes the run with no
point lost or duplicated, no launched server outlives it), and a sweep point whose engine process is SIGKILLed
(the requests fail with the reason, the point is written, the next run resumes against a restarted server)."""

from __future__ import annotations

import csv
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sweep.mock.calibrate import start_mock
from tests.engine.entrypoints.serve_helpers import _descendants, metric, pid_alive, start_server, wait_until

REPO = Path(__file__).resolve().parents[3]
POINTS = ["c0001", "c0002", "c0004"]
NUM_PROMPTS = 12


def _sweep(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "cli", "sweep", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip


def _check_files_parse(run_dir: Path) -> set[str]:
    """Every file of the run parses; returns the finished points."""
    if (run_dir / "config.json").exists():
        json.loads((run_dir / "config.json").read_text())
    finished = set()
    for point in (run_dir / "points").glob("*.json"):
        finished.add(json.loads(point.read_text())["label"])
    if (run_dir / "requests.jsonl").exists():
        for line in (run_dir / "requests.jsonl").read_text().splitlines():
            json.loads(line)
    if (run_dir / "summary.csv").exists():
        assert len(list(csv.DictReader((run_dir / "summary.csv").open()))) <= len(finished)
    return finished


@pytest.mark.slow
def test_sweep_killed_at_random_moments_resumes_without_loss(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    rng = random.Random(17)
    with start_mock(20.0, 5.0, tmp_path / "mock.log") as mock:
        args = ["--url", mock.url, "--model", "mock", "--tokenizer", "tiny-random", "--no-report", "--concurrency",
                "1,2,4", "--num-prompts", str(NUM_PROMPTS), "--workload", "fixed", "--input-len", "16",
                "--output-len", "8", "--output-dir", str(run_dir)]  # fmt: skip
        finished_before: set[str] = set()
        for attempt in range(2):  # two kills at random moments, each run resuming the last
            process = _sweep(*args, *(["--resume"] if attempt else []))
            time.sleep(rng.uniform(2.0, 6.0))
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            finished = _check_files_parse(run_dir)
            assert finished >= finished_before  # a finished point is never lost
            finished_before = finished
        final = _sweep(*args, "--resume")
        output = final.communicate(timeout=300)[0]
        assert final.returncode == 0, output[-3000:]
    assert _check_files_parse(run_dir) == set(POINTS)
    rows = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    per_point = {label: sum(r["label"] == label for r in rows) for label in POINTS}
    assert per_point == dict.fromkeys(POINTS, NUM_PROMPTS)  # no point lost or duplicated


@pytest.mark.slow
def test_engine_killed_mid_point_then_resume_against_a_restarted_server(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    common = ["--model", "tiny-random", "--tokenizer", "tiny-random", "--no-report", "--workload", "fixed",
              "--input-len", "16", "--output-len", "64", "--num-prompts", "16", "--output-dir", str(run_dir)]
    server = start_server()
    try:
        engine_pid = max(server.descendants())  # spawned after multiprocessing's resource tracker
        sweep = _sweep("--url", server.url + "/v1", "--concurrency", "4,8", *common)
        assert wait_until(lambda: metric(server, "vllm:num_requests_running") > 0, 120)  # point c0004 under way
        os.kill(engine_pid, signal.SIGKILL)
        output = sweep.communicate(timeout=300)[0]
    finally:
        server.stop()
    assert sweep.returncode == 2 and "answers /health with 503" in output and "--resume" in output, output[-3000:]
    rows = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    failed = [r for r in rows if not r["success"]]
    assert failed and all(r["error"] for r in failed)
    assert any("engine" in r["error"] for r in failed)
    assert _check_files_parse(run_dir) == {"c0004"}  # the point under way was written, with its failures
    restarted = start_server("--port", server.url.rsplit(":", 1)[1])  # same URL: --resume checks the target
    try:
        resumed = subprocess.run([sys.executable, "-m", "cli", "sweep", "--url", restarted.url + "/v1",
                                  "--concurrency", "4,8", *common, "--resume"], cwd=REPO, capture_output=True,
                                 text=True, timeout=300)  # fmt: skip
    finally:
        restarted.stop()
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _check_files_parse(run_dir) == {"c0004", "c0008"}
    rows = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    assert sorted(r["label"] for r in rows).count("c0008") == 16 and len(rows) == 32
    assert all(pid_alive(p) is False for p in _descendants(restarted.process.pid))
