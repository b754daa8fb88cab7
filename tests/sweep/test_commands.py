"""`bench sweep` end to end: the built-in engine on tiny-random, launched, swept, shut down, read back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import sweep
from sweep.launcher import free_port

REPO = Path(__file__).resolve().parents[2]


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", *args], cwd=REPO, capture_output=True, text=True, timeout=600)


def test_bad_flags_fail_clearly(tmp_path: Path) -> None:
    both = bench("sweep", "--concurrency", "1", "--request-rate", "2", "--output-dir", str(tmp_path / "x"))
    assert both.returncode == 2 and "exactly one of --concurrency" in both.stderr
    knobs = bench(
        "sweep",
        "--url",
        "http://127.0.0.1:9/v1",
        "--concurrency",
        "1",
        "--max-num-seqs",
        "4",
        "--output-dir",
        str(tmp_path / "y"),
    )
    assert knobs.returncode == 2 and "engine knobs apply only to the built-in engine" in knobs.stderr
    slo = bench(
        "sweep",
        "--url",
        "http://127.0.0.1:9/v1",
        "--concurrency",
        "1",
        "--slo",
        "itl=5",
        "--output-dir",
        str(tmp_path / "z"),
    )
    assert slo.returncode == 2 and "bad SLO item" in slo.stderr
    down = bench(
        "sweep",
        "--url",
        f"http://127.0.0.1:{free_port()}/v1",
        "--model",
        "m",
        "--tokenizer",
        "tiny-random",
        "--concurrency",
        "1",
        "--output-dir",
        str(tmp_path / "w"),
    )
    assert down.returncode == 2 and "cannot reach" in down.stderr
    for name in "xyzw":
        assert not (tmp_path / name).exists()  # nothing written for a run that could not start


@pytest.mark.slow
def test_sweep_builtin_engine_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = bench(
        "sweep",
        "--model",
        "tiny-random",
        "--concurrency",
        "1,2",
        "--num-prompts",
        "3",
        "--input-len",
        "64",
        "--output-len",
        "6",
        "--num-warmups",
        "1",
        "--reset-prefix-cache",
        "--slo",
        "ttft=60000",
        "--max-num-seqs",
        "4",
        "--endpoint",
        "chat",
        "--output-dir",
        str(out),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for name in (
        "config.json",
        "points/c0001.json",
        "points/c0002.json",
        "requests.jsonl",
        "summary.csv",
        "server.log",
        "report/report.html",
    ):
        assert (out / name).is_file(), name
    results = sweep.load_results(out)
    assert list(results.points["completed"]) == [3, 3] and list(results.points["failed"]) == [0, 0]
    assert list(results.points["slo_attainment"]) == [1.0, 1.0]
    assert results.config["target"]["backend"] == "servelab"
    assert results.config["target"]["engine_knobs"] == {"max_num_seqs": 4}
    requests = results.requests
    assert len(requests) == 6 and requests["success"].all()
    assert (requests["output_tokens"] == 6).all()  # ignore_eos: the engine ran every request to its length
    assert (requests["prompt_tokens"] == 64).all()  # usage agrees with the synthesized chat prompt's length
    timing = requests["server_timing"].iloc[0]
    assert timing["arrival_time"] <= timing["first_scheduled_time"] <= timing["first_token_time"]
    point = json.loads((out / "points" / "c0002.json").read_text())
    assert point["fidelity"]["client"]["prefix_cache_reset"] is True
    assert point["mean_prefill_ms"] > 0 and "mean_ttft_rest_ms" in point
    assert "shutting down" in (out / "server.log").read_text()  # SIGTERM, clean shutdown
