"""The load generator's additions (issue 29) through `bench sweep` against the real `bench serve` on tiny-random:
per-token and per-class SLOs, cancellations and a steady window in one open-loop sweep of a classed trace, and the
shipped prompt set sent as text in a second. One engine serves both; the sweeps run in this process (typer's
CliRunner, the command line a user types). Assertions are on the run directory's fields, never on timings."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

import sweep
from cli import app
from engine.tokenizer import get_tokenizer
from sweep.run.launcher import launch
from workloads.text_workloads import text_prompts

pytestmark = pytest.mark.slow

COMMON = ["--model", "tiny-random", "--tokenizer", "tiny-random", "--no-report", "--no-calibration"]


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("engine") / "server.log"
    with launch("tiny-random", {"max_num_seqs": 4}, log, health_timeout_s=120) as server:
        yield server.url


def _sweep(url: str, out: Path, *flags: str) -> sweep.Results:
    result = CliRunner().invoke(app, ["sweep", "--url", url, *COMMON, *flags, "--output-dir", str(out)])
    assert result.exit_code == 0, result.output[-3000:]
    return sweep.load_results(out)


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]


def test_per_token_and_per_class_slos_cancellations_and_a_steady_window(engine_url: str, tmp_path: Path) -> None:
    trace = tmp_path / "classed.csv"
    trace.write_text("input_len,output_len,class\n" + "".join(f"16,24,{c}\n" for c in ["interactive", "batch"] * 8))
    out = tmp_path / "run"
    # every limit generous but batch's 0 ms stall: any request of 2+ chunks misses it, so batch attains 0
    slo = "itl_p99=60000,max_stall=60000;interactive:ttft=60000;batch:max_stall=0"
    run = _sweep(engine_url, out, "--workload", str(trace), "--request-rate", "8", "--num-prompts", "16",
                 "--slo", slo, "--cancel-rate", "0.5", "--cancel-after", "2tok",
                 "--warmup-seconds", "0.5", "--cooldown-seconds", "0.5", "--num-warmups", "1")  # fmt: skip
    config = run.config
    assert config["slo"] == {"itl_p99_ms": 60000.0, "max_stall_ms": 60000.0, "interactive:ttft_ms": 60000.0,
                             "batch:max_stall_ms": 0.0}  # fmt: skip
    assert config["sweep"]["cancel_rate"] == 0.5 and config["sweep"]["cancel_after"] == "2tok"
    assert (config["sweep"]["warmup_seconds"], config["sweep"]["cooldown_seconds"]) == (0.5, 0.5)

    rows = _rows(out)
    assert len(rows) == 16 and [r["request_class"] for r in rows] == ["interactive", "batch"] * 8
    cancelled = [r for r in rows if r["cancelled"]]
    assert len(cancelled) == 8  # round(0.5 x 16), aborted after 2 tokens: neither success nor failure
    assert all(not r["success"] and r["error"] is None and r["output_tokens"] < 24 for r in cancelled)
    finished = [r for r in rows if not r["cancelled"]]
    assert all(r["success"] and r["output_tokens"] == 24 for r in finished)

    point = json.loads(next((out / "points").glob("*.json")).read_text())
    assert point["window"] == "steady" and point["window_rule"] == "fixed" and point["window_start_s"] == 0.5
    assert point["window_end_s"] > point["window_start_s"] and point["full"]["cancelled"] == 8
    assert any(r["in_window"] for r in rows) and not all(r["in_window"] for r in rows)  # the first sends are out
    in_window = [r for r in rows if r["in_window"]]
    assert point["cancelled"] == sum(r["cancelled"] for r in in_window)
    assert point["completed"] == sum(r["success"] for r in in_window)
    # the whole point: 8 finished (4 a class), 8 cancelled and out of the attainment's denominator
    full = point["full"]
    assert full["completed"] == 8 and full["slo_attainment"] == 0.5
    good = full["request_goodput"]  # every good request is interactive
    assert full["classes"] == {
        "interactive": {"requests": 8, "completed": 4, "request_goodput": good, "slo_attainment": 1.0},
        "batch": {"requests": 8, "completed": 4, "request_goodput": 0.0, "slo_attainment": 0.0},  # the 0 ms stall
    }
    # the window's figures are the reported ones: its classes are judged the same way, over its requests only
    assert set(point["classes"]) == {"interactive", "batch"}
    assert point["classes"]["batch"]["slo_attainment"] in (0.0, None)
    assert point["classes"]["interactive"]["slo_attainment"] in (1.0, None)
    assert point["classes"]["interactive"]["requests"] == sum(r["request_class"] == "interactive" for r in in_window)
    assert point["p99_max_stall_ms"] > 0  # each request's longest gap, recorded per point
    summary = next(csv.DictReader((out / "summary.csv").open()))  # the reported figures are the window's
    assert int(summary["completed"]) == point["completed"] and int(summary["cancelled"]) == point["cancelled"]


def test_the_shipped_prompt_set_reaches_the_engine_as_text(engine_url: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    # seed 65 draws four of the set's shorter answers (at most 160 tokens; the set goes to 512), no warm-up
    run = _sweep(engine_url, out, "--workload", "prompts:servelab-prompts", "--concurrency", "4", "--num-prompts", "4",
                 "--seed", "65", "--num-warmups", "0")  # fmt: skip
    assert run.config["workload"]["workload"] == "prompts:servelab-prompts"
    rows = _rows(out)
    assert len(rows) == 4 and all(r["success"] for r in rows)
    salt = f"{run.config['workload']['salt']}-c0004"
    specs, _ = text_prompts("prompts:servelab-prompts", "completions", None, get_tokenizer("tiny-random"), 4, 65, salt)
    assert sorted(r["requested_input_len"] for r in rows) == sorted(s.input_len for s in specs)
    # the engine counted the same prompt tokens: it received the file's text, not synthesized filler of that length
    assert all(r["prompt_tokens"] == r["requested_input_len"] for r in rows)
    assert all(r["output_tokens"] == r["requested_output_len"] for r in rows)  # the file's output lengths
    assert len({r["requested_input_len"] for r in rows}) > 1


def test_the_max_load_search_with_repeats_a_confidence_and_the_auto_window(engine_url: str, tmp_path: Path) -> None:
    """`--max-load-under-slo --repeats 2 --confidence 0.9 --steady-window auto` with a TTFT limit no request meets
    (1 us): the first load is measured twice and judged on its pooled counts by a Wilson interval, every point by
    its detected window (or whole, said so), and the answer is "none", an interval open below 1."""
    out = tmp_path / "run"
    _sweep(engine_url, out, "--workload", "fixed", "--input-len", "16", "--output-len", "16", "--concurrency", "1",
           "--max-load-under-slo", "--repeats", "2", "--confidence", "0.9", "--num-prompts", "8",
           "--steady-window", "auto", "--slo", "ttft=0.001", "--num-warmups", "0")  # fmt: skip
    search = json.loads((out / "search.json").read_text())
    assert search["confidence"] == 0.9 and search["best"] is None and search["max_load_interval"] == [None, 1]
    from sweep.run.search import wilson_interval

    (probe,) = search["probes"]
    assert probe["value"] == 1 and len(probe["measurements"]) == 2 and probe["labels"] == ["c0001", "c0001-rep1"]
    assert probe["good"] == 0 and probe["verdict"] == "fail"
    assert 0 < probe["judged"] <= 16  # those in the points' steady windows, when one was found
    assert (probe["ci_low"], probe["ci_high"]) == pytest.approx(wilson_interval(0, probe["judged"], 0.9))
    for label in probe["labels"]:
        point = json.loads((out / "points" / f"{label}.json").read_text())
        assert point["window"] == "full" or (point["window"] == "steady" and point["window_rule"] == "auto")
