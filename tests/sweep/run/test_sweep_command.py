"""`bench sweep` end to end: the built-in engine on tiny-random, launched, swept, shut down, read back."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import sweep
import sweep.commands
from sweep.mock.calibrate import start_mock
from sweep.run.launcher import free_port, launch

REPO = Path(__file__).resolve().parents[3]


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


def test_a_server_root_url_means_its_v1_and_a_path_without_the_api_is_a_clear_error(tmp_path: Path) -> None:
    """`--url http://HOST:PORT` is the server's root, as vLLM's `bench serve --base-url` takes it: the sweep posts
    under its /v1. A path with no OpenAI API under it (GET .../models is a 404) fails before anything is written,
    rather than as a run of 404 failures."""
    common = ["--model", "mock", "--tokenizer", "tiny-random", "--no-report", "--no-calibration", "--workload",
              "fixed", "--input-len", "8", "--output-len", "2", "--num-prompts", "2", "--concurrency", "1"]
    with start_mock(1.0, 1.0, tmp_path / "mock.log") as mock:
        root = mock.url.removesuffix("/v1")
        served = bench("sweep", "--url", root, *common, "--output-dir", str(tmp_path / "root"))
        wrong = bench("sweep", "--url", root + "/api", *common, "--output-dir", str(tmp_path / "wrong"))
    assert served.returncode == 0, served.stderr[-3000:]
    point = json.loads((tmp_path / "root" / "points" / "c0001.json").read_text())
    assert point["completed"] == 2 and point["failed"] == 0
    assert json.loads((tmp_path / "root" / "config.json").read_text())["target"]["url"] == root + "/v1"
    assert wrong.returncode == 2 and "has no OpenAI API" in wrong.stderr and "/v1" in wrong.stderr
    assert not (tmp_path / "wrong").exists()


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


def test_resume_and_client_procs_flags(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with start_mock(2.0, 1.0, tmp_path / "mock.log") as mock:
        common = ["sweep", "--url", mock.url, "--model", "mock", "--tokenizer", "tiny-random", "--no-report"]
        common += ["--workload", "fixed", "--input-len", "16", "--output-len", "4", "--num-prompts", "4"]
        common += ["--client-procs", "2", "--output-dir", str(out)]
        first = bench(*common, "--concurrency", "2")
        assert first.returncode == 0, first.stderr[-3000:]
        finished = (out / "points" / "c0002.json").read_bytes()
        again = bench(*common, "--concurrency", "2,4")
        assert again.returncode == 2 and "--resume" in again.stderr  # a run is never overwritten
        resumed = bench(*common, "--concurrency", "2,4", "--resume")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
    shown = resumed.stdout + resumed.stderr
    assert "c0002: already measured, kept" in shown and "TTFT p50" in shown  # the kept point, then a table row
    assert any(line.split()[:3] == ["c0004", "4", "0"] for line in shown.splitlines())  # label, done, failed
    assert (out / "points" / "c0002.json").read_bytes() == finished  # the finished point was not repeated
    results = sweep.load_results(out)
    assert list(results.points["label"]) == ["c0002", "c0004"] and list(results.points["completed"]) == [4, 4]
    assert results.config["sweep"]["client_procs"] == 2
    point = json.loads((out / "points" / "c0004.json").read_text())
    assert point["fidelity"]["client"]["client_procs"] == 2  # the point really ran on two client processes


def test_calibrate_reports_added_latency_and_chunk_rate(tmp_path: Path) -> None:
    report_path = tmp_path / "calibration.json"
    args = ["lab", "calibrate", "--concurrency", "1,4", "--num-prompts", "8", "--output-len", "4"]
    done = bench(*args, "--ttft-ms", "5", "--itl-ms", "2", "--output-json", str(report_path))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "maximum streamed chunks/s at concurrency 4" in done.stderr
    report = json.loads(report_path.read_text())
    assert sorted(report["timed"]) == ["1", "4"]
    for figures in report["timed"].values():
        assert (figures["completed"], figures["failed"]) == (8, 0)
        assert figures["ttft_error_p50_ms"] > -1.0  # the client cannot see a first token before the mock sends it
        assert isinstance(figures["tpot_error_p99_ms"], float)
        assert figures["chunks_per_s"] > 0
    assert report["max_rate"]["concurrency"] == 4 and report["max_rate"]["chunks_per_s"] > 0
    bad = bench("lab", "calibrate", "--concurrency", "0")
    assert bad.returncode == 2 and "concurrencies must be positive" in bad.stderr


def test_mock_server_command_serves_and_rejects_bad_timing(tmp_path: Path) -> None:
    template = f"{shlex.quote(sys.executable)} -m cli lab mock-server --port {{port}} --ttft-ms 1 --itl-ms 1 --model m1"
    with launch("m1", {}, tmp_path / "mock.log", template=template, health_timeout_s=60) as server:
        models = json.loads(urllib.request.urlopen(server.url + "/models", timeout=5).read())
        assert [m["id"] for m in models["data"]] == ["m1"]
    bad = bench("lab", "mock-server", "--ttft-ms", "-1")
    assert bad.returncode == 2 and "ttft_ms and itl_ms must be >= 0" in bad.stderr


def test_the_report_is_rendered_by_the_renderer_the_command_layer_hands_in(tmp_path: Path) -> None:
    """`bench` (cli.py) wires `reports.render_report` into `bench sweep`; registered without one, no report."""
    common = ["--model", "mock", "--tokenizer", "tiny-random", "--workload", "fixed", "--input-len", "16"]
    common += ["--output-len", "4", "--num-prompts", "2", "--concurrency", "1", "--slo", "ttft=5000"]
    bare, bare_dir = typer.Typer(), tmp_path / "bare"
    sweep.commands.register(bare, {"lab": typer.Typer()})
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        with start_mock(2.0, 1.0, tmp_path / "mock.log") as mock:
            wired = bench("sweep", "--url", mock.url, *common, "--output-dir", str(tmp_path / "wired"))
            unwired = CliRunner().invoke(bare, ["sweep", "--url", mock.url, *common, "--output-dir", str(bare_dir)])
    finally:
        signal.signal(signal.SIGTERM, sigterm)  # the command turns SIGTERM into KeyboardInterrupt
    assert wired.returncode == 0, wired.stderr[-3000:]
    assert f"report: {tmp_path / 'wired' / 'report' / 'report.html'}" in wired.stdout
    assert "TTFT" in (tmp_path / "wired" / "report" / "report.md").read_text()
    assert unwired.exit_code == 0, unwired.output
    assert (bare_dir / "points" / "c0001.json").is_file() and not (bare_dir / "report").exists()
    assert "report:" not in unwired.output


@pytest.mark.slow
def test_cancellations_against_the_builtin_engine(tmp_path: Path) -> None:
    """`--cancel-rate 0.5 --cancel-after 2tok` against `bench serve`: half the requests are aborted after two tokens,
    recorded as cancelled, and the engine stops generating them (its generated-token counter stays far below the
    full outputs)."""
    out = tmp_path / "run"
    done = bench("sweep", "--model", "tiny-random", "--concurrency", "2", "--num-prompts", "6", "--input-len", "16",
                 "--output-len", "96", "--max-num-seqs", "4", "--cancel-rate", "0.5", "--cancel-after", "2tok",
                 "--no-report", "--no-calibration", "--output-dir", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    results = sweep.load_results(out)
    point, requests = results.points.iloc[0], results.requests
    assert (point["completed"], point["failed"], point["cancelled"]) == (3, 0, 3)
    cancelled = requests[requests["cancelled"]]
    assert len(cancelled) == 3 and (cancelled["output_tokens"] < 96).all()
    assert (requests.loc[~requests["cancelled"], "output_tokens"] == 96).all()
    assert point["generation_tokens"] < 3 * 96 + 3 * 48  # the aborted requests did not run on to 96 tokens
