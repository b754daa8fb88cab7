"""`bench sweep --stop-when-saturated` against a mock with a known capacity: the point above it is marked and
stopped early, the load above that is skipped, the one below is untouched; bad combinations are usage errors."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from cli import app
from reports.importers import load_run
from reports.render import saturation_note
from reports.tables import point_table
from sweep.mock.calibrate import start_mock
from sweep.mock.server import MockConfig
from sweep.point.client import PromptRequest
from sweep.point.records import RequestRecord
from sweep.point.runner import PointSpec, WorkloadConfig
from sweep.point.saturation import NOT_SENT_AT_STOP, STOPPED_ERROR, Saturation, SaturationConfig
from sweep.point.watch import stopped_point_records
from sweep.run.repeats import pooled_point
from sweep.run.search import point_counts
from sweep.run.sweeper import SweepConfig, Sweeper

REPO = Path(__file__).resolve().parents[3]
TTFT_MS, ITL_MS, OUTPUT_LEN, SLOTS = 20.0, 5.0, 20, 4
# a short window for a short test (the defaults take 10 s to judge); the rule is the same. A 4 s point at 17
# req/s has ~60 requests due past its ramp-up: enough to judge at 10x capacity (34), not at the default 2x (150).
FAST = dict(interval_s=0.25, window_s=1.5, min_observe_s=1.0, confirm=2, judge_ratio=10.0)


def sweep_config(url: str, out: Path, values: list[float], stop: bool, **overrides: object) -> SweepConfig:
    fields: dict = dict(
        output_dir=out, mode="rate", values=values, url=url, model="mock", tokenizer="tiny-random",
        workload=WorkloadConfig(workload="fixed", input_len=8, output_len=OUTPUT_LEN, seed=1),
        num_prompts=None, duration=4.0, slo={"ttft_ms": 1000.0}, command="bench sweep (test)",
        saturation=SaturationConfig(stop=stop, **FAST),
    )
    fields.update(overrides)
    return SweepConfig(**fields)


@pytest.mark.slow  # ~7 s of points; loading the tokenizer (transformers) adds ~8 s on a loaded 2-core machine
def test_a_saturated_point_stops_early_and_higher_loads_are_skipped(tmp_path: Path) -> None:
    capacity = MockConfig(ttft_ms=TTFT_MS, itl_ms=ITL_MS, max_num_seqs=SLOTS).capacity_rps(OUTPUT_LEN)  # 34.8
    server = start_mock(TTFT_MS, ITL_MS, tmp_path / "mock.log")
    server.command += ["--max-num-seqs", str(SLOTS)]
    out, console = tmp_path / "run", Console(file=io.StringIO(), width=300)
    with server:
        with Sweeper(sweep_config(server.url, out, [17, 70, 140], stop=True), console) as sweeper:
            below, above = sweeper.run()  # 0.5x, 2x and 4x the capacity
        assert below["saturated"] is False and "saturated_at_s" not in below and below["failed"] == 0
        assert above["saturated"] is True and above["saturated_at_s"] < 3.9  # before the point's 4 s were up
        evidence = above["saturation"]
        # completions at most the capacity (less when the shared test machine slows the mock), well below the offer
        assert evidence["achieved_rps"] < 1.15 * capacity < 0.9 * evidence["offered_rps"] and evidence["stopped"]
        # the ramp-up above was bounded by the service time measured below
        assert evidence["reference_service_s"] == below["saturation"]["service_p90_s"] > 0
        assert evidence["ramp_s"] <= 3 * evidence["reference_service_s"]
        assert above["duration"] < above["saturated_at_s"] + 0.5  # ended at the stop, not after a drain
        rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
        cancelled = [r for r in rows if r["label"] == "r0070.00" and r["error"] == STOPPED_ERROR]
        assert len(cancelled) == evidence["cancelled"] > 0 and above["failed"] == len(cancelled)
        assert evidence["not_due"] > 0 and max(r["intended_send_time"] for r in rows if r["label"] == "r0070.00") < (
            min(r["intended_send_time"] for r in rows if r["label"] == "r0070.00") + above["saturated_at_s"] + 0.1
        )
        assert sorted(p.stem for p in (out / "points").glob("*.json")) == ["r0017.00", "r0070.00"]
        skipped = json.loads((out / "skipped.json").read_text())
        assert [s["label"] for s in skipped] == ["r0140.00"] and "r0070.00" in skipped[0]["reason"]
        summary = list(csv.DictReader(io.StringIO((out / "summary.csv").read_text())))
        assert [(r["label"], r["saturated"]) for r in summary] == [("r0017.00", "False"), ("r0070.00", "True")]
        said = console.file.getvalue()
        assert "r0070.00: saturated at" in said and "stopped there" in said and "r0140.00: skipped" in said
        with Sweeper(sweep_config(server.url, out, [17, 70, 140], stop=True, resume=True), console) as sweeper:
            assert [p["label"] for p in sweeper.run()] == ["r0017.00", "r0070.00"]  # kept, and 140 skipped again
        assert json.loads((out / "skipped.json").read_text()) == skipped
    run = load_run(out)  # the report: the saturated point and the skipped load are both visible
    assert list(point_table(run)["saturated"]) == ["no", f"at {above['saturated_at_s']:.1f} s"]
    note = saturation_note([run])
    assert "over-saturated" in note and "r0070.00" in note and "not measured: r0140.00" in note


@pytest.mark.parametrize("flags,message", [
    (["--concurrency", "4"], "applies to --request-rate points"),
    (["--request-rate", "2", "--repeats", "2"], "without --repeats"),
    (["--request-rate", "inf"], "finite --request-rate"),
])
def test_stop_when_saturated_refuses_points_it_cannot_judge(tmp_path: Path, flags: list[str], message: str) -> None:
    out = tmp_path / "run"
    args = ["sweep", "--url", "http://127.0.0.1:9/v1", "--stop-when-saturated", "--output-dir", str(out), *flags]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and message in result.output, result.output
    assert not out.exists()  # refused before anything was sent or written


def test_a_stopped_point_keeps_what_was_due_by_the_stop() -> None:
    spec = PointSpec(label="r0010.00", mode="rate", rate=10.0, duration=3.0, concurrency=1)
    prompts = [PromptRequest(i, "p", None, 1, 2) for i in range(6)]
    offsets = [0.1, 0.2, 0.3, 0.4, 1.5, 2.5]
    sent = [
        RequestRecord(0, 1, 2, 100.1, send_time=100.1, success=True),
        RequestRecord(1, 1, 2, 100.2, send_time=100.2, error=STOPPED_ERROR),  # cancelled in flight
    ]
    result = {"fired": Saturation(1.0, 10.0, 4.0, 4, 3.0, 9.0, 1.0, None, None), "stopped": True}
    kept, records = stopped_point_records(spec, prompts, offsets, 100.0, sent, result)
    assert [p.index for p in kept] == [0, 1, 2, 3] and result["not_due"] == 2 and result["not_sent"] == 2
    not_sent = [(r.index, r.sent, r.error) for r in records[2:]]  # due, still waiting for the --max-concurrency slot
    assert not_sent == [(2, False, NOT_SENT_AT_STOP), (3, False, NOT_SENT_AT_STOP)]


def test_the_search_takes_a_saturated_point_as_failing() -> None:
    assert point_counts({"slo_attainment": 0.97, "saturated": True}).attainment == 0.0
    assert point_counts({"slo_attainment": 0.97, "saturated": True}).saturated
    assert point_counts({"slo_attainment": 0.97, "saturated": False}).attainment == 0.97


def test_a_repeated_point_is_saturated_when_any_repeat_was() -> None:
    calm = {"label": "r0010.00", "duration": 2.0, "saturated": False}
    saturated = {"label": "r0010.00", "duration": 1.0, "saturated": True, "saturated_at_s": 1.5,
                 "saturation": {"offered_rps": 10.0}}
    pooled = pooled_point([calm, saturated], [], [50.0], None, False)
    assert pooled["saturated"] is True and pooled["saturated_at_s"] == 1.5
    assert pooled["saturation"] == {"offered_rps": 10.0, "repeats": [None, 1.5]}
    assert pooled_point([calm, calm], [], [50.0], None, False)["saturated"] is False
    unjudged = {"label": "r0010.00", "duration": 2.0, "saturated": None, "saturation": {"judged": False}}
    assert pooled_point([calm, unjudged], [], [50.0], None, False)["saturated"] is False
    none = pooled_point([unjudged, unjudged], [], [50.0], None, False)
    assert none["saturated"] is None and none["saturation"] == {"judged": False}  # no repeat judged: not "no"
    assert "saturated" not in pooled_point([{"label": "c0001", "duration": 1.0}], [], [50.0], None, False)


@pytest.mark.slow  # ~35 s of points with the detector's default constants, plus the engine's start-up
def test_against_the_builtin_engine_a_point_far_past_capacity_stops_and_the_next_is_skipped(tmp_path: Path) -> None:
    """`bench sweep --stop-when-saturated` against `bench serve` (tiny-random, one sequence at a time, 64 output
    tokens: a few requests a second at most): 40 req/s is past capacity many times over and stops soon after the
    detector's 10 s minimum, with the ramp-up bounded by the 0.5 req/s point's service time; 80 is skipped."""
    out = tmp_path / "run"
    args = ["sweep", "--model", "tiny-random", "--request-rate", "0.5,40,80", "--duration", "20", "--input-len", "16",
            "--output-len", "64", "--max-num-seqs", "1", "--stop-when-saturated", "--no-report", "--no-calibration",
            "--output-dir", str(out)]
    done = subprocess.run([sys.executable, "-m", "cli", *args], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    low, high = (json.loads((out / "points" / f"{label}.json").read_text()) for label in ("r0000.50", "r0040.00"))
    assert low["saturated"] is None and low["saturation"]["due_past_ramp"] < 150  # 10 requests: too few to judge
    assert high["saturated"] is True and high["saturated_at_s"] < 15.0 and high["saturation"]["stopped"]
    assert high["saturation"]["reference_service_s"] == low["saturation"]["service_p90_s"]
    assert high["saturation"]["achieved_rps"] < 0.5 * high["saturation"]["offered_rps"]
    assert [s["label"] for s in json.loads((out / "skipped.json").read_text())] == ["r0080.00"]
    assert "r0000.50: over-saturation not judged" in done.stderr and "r0040.00: saturated at" in done.stderr
