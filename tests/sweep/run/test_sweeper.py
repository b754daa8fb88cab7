"""A sweep against the mock writes the run directory of the results contract, and resumes after an interruption."""

from __future__ import annotations

import csv
import io
import json
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

import sweep
import sweep.run.sweeper
from sweep.mock.calibrate import start_mock
from sweep.point.runner import WorkloadConfig
from sweep.run.launcher import ServerProcess
from sweep.run.sweeper import SweepConfig, Sweeper, run_sweep


@pytest.fixture(scope="module")
def mock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with start_mock(5.0, 1.0, tmp_path_factory.mktemp("mock") / "mock.log") as server:
        yield server


def config(mock: ServerProcess | None, out: Path, **overrides: object) -> SweepConfig:
    fields = dict(
        output_dir=out,
        mode="concurrency",
        values=[1, 4],
        url=mock.url if mock else None,
        model="mock",
        tokenizer="tiny-random",
        workload=WorkloadConfig(workload="random", input_len=24, output_len=6, range_ratio=0.5, seed=1),
        num_prompts=8,
        num_warmups=2,
        reset_prefix_cache=True,
        slo={"ttft_ms": 10_000.0},
        percentiles=[50.0, 99.9],
        command="bench sweep (test)",
    )
    fields.update(overrides)
    return SweepConfig(**fields)  # type: ignore[arg-type]


def test_run_directory_contract(mock: ServerProcess, tmp_path: Path) -> None:
    run_dir = run_sweep(config(mock, tmp_path / "run"))
    stored = json.loads((run_dir / "config.json").read_text())
    for key in (
        "run_id",
        "created",
        "target",
        "workload",
        "sweep",
        "slo",
        "percentiles",
        "versions",
        "machine",
        "command",
    ):
        assert key in stored
    assert stored["target"]["backend"] == "openai" and stored["workload"]["salt"]
    assert sorted(p.name for p in (run_dir / "points").iterdir()) == ["c0001.json", "c0004.json"]
    point = json.loads((run_dir / "points" / "c0004.json").read_text())
    assert (point["label"], point["max_concurrency"], point["request_rate"]) == ("c0004", 4, "inf")
    assert point["completed"] == 8 and point["failed"] == 0 and point["slo_attainment"] == 1.0
    # the mock's /metrics, scraped over the point (after the warm-ups): the server counted what the client did
    assert point["generation_tokens"] == point["total_output_tokens"]
    assert point["prompt_tokens"] == point["total_input_tokens"]
    for name in (  # the results contract: vLLM's field names
        "duration",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
        "request_goodput",
    ):
        assert isinstance(point[name], float | int) and point[name] > 0, name
    assert point["request_throughput"] == pytest.approx(point["completed"] / point["duration"])
    # closed loop: every request is "due" at t0, so queue-inclusive figures would only measure elapsed time
    assert not [k for k in point if "queued" in k or "client_queue" in k]
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", "p50", "p99.9"):
            assert isinstance(point[f"{stat}_{metric}_ms"], float)
    assert point["total_output_tokens"] == sum(
        json.loads(line)["output_tokens"]
        for line in (run_dir / "requests.jsonl").read_text().splitlines()
        if json.loads(line)["label"] == "c0004"
    )
    assert point["fidelity"]["client"]["prefix_cache_reset"] is True
    assert point["fidelity"]["input_exact_fraction"] == 1.0  # the mock counts words; synthesis made words
    assert point["mean_queue_ms"] == 0.0  # the mock's servelab timing: never queued
    rows = list(csv.DictReader((run_dir / "summary.csv").open()))
    assert [r["label"] for r in rows] == ["c0001", "c0004"]

    results = sweep.load_results(run_dir)
    assert list(results.points["label"]) == ["c0001", "c0004"] and set(results.points["run"]) == {"run"}
    assert len(results.requests) == 16 and results.requests["success"].all()
    first = results.requests.iloc[0]
    assert first["send_time"] <= first["first_token_time"] <= first["last_token_time"] <= first["end_time"]
    assert first["requested_output_len"] == len(first["chunk_times"])  # ignore_eos: one token per chunk
    assert results.config["sweep"]["values"] == [1, 4]
    with pytest.raises(FileExistsError):
        run_sweep(config(mock, tmp_path / "run"))  # never overwrite a run without --resume


def test_interrupted_sweep_resumes(mock: ServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_run_point = sweep.run.sweeper.run_point
    labels: list[str] = []

    def interrupt_second(*args, **kwargs):
        spec = args[1]
        labels.append(spec.label)
        if spec.label == "c0004":
            raise KeyboardInterrupt
        return real_run_point(*args, **kwargs)

    monkeypatch.setattr(sweep.run.sweeper, "run_point", interrupt_second)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run_sweep(config(mock, out, values=[1, 4, 2]))
    assert [p.name for p in (out / "points").iterdir()] == ["c0001.json"]
    with (out / "requests.jsonl").open("a") as f:  # rows of a point that died mid-write
        f.write(json.dumps({"label": "c0004", "index": 0}) + "\n" + '{"label": "c00')
    salt = json.loads((out / "config.json").read_text())["workload"]["salt"]

    monkeypatch.setattr(
        sweep.run.sweeper, "run_point", lambda *a, **k: (labels.append(a[1].label), real_run_point(*a, **k))[1]
    )
    labels.clear()
    run_sweep(config(mock, out, values=[1, 4, 2], resume=True))
    assert labels == ["c0004", "c0002"]  # c0001 was not repeated
    results = sweep.load_results(out)
    assert sorted(results.points["label"]) == ["c0001", "c0002", "c0004"]
    assert len(results.requests) == 24 and results.requests.groupby("label").size().tolist() == [8, 8, 8]
    assert results.config["workload"]["salt"] == salt  # the run keeps its salt
    with pytest.raises(ValueError, match="workload"):
        run_sweep(config(mock, out, resume=True, workload=WorkloadConfig(workload="fixed", input_len=5, output_len=2)))


def test_rate_sweep_and_search(mock: ServerProcess, tmp_path: Path) -> None:
    run_dir = run_sweep(
        config(mock, tmp_path / "rate", mode="rate", values=[40.0], burstiness=0.5, num_warmups=0, max_concurrency=2)
    )
    point = sweep.load_results(run_dir).points.iloc[0]
    assert point["label"] == "r0040.00" and point["request_rate"] == 40.0 and point["burstiness"] == 0.5
    assert point["max_concurrency"] == 2 and "mean_e2el_including_client_queue_ms" in point  # open loop + cap

    # 20 of 20 good is uncertain at 95 % (Wilson lower bound 0.84 < 0.9); pooled with one more, 40 of 40 passes
    run_dir = run_sweep(
        config(mock, tmp_path / "search", values=[1], max_load_under_slo=True, max_load=4, num_warmups=0,
               num_prompts=20, search_repeats=1)
    )
    search = json.loads((run_dir / "search.json").read_text())
    assert search["best"] == 4 and search["max_load_interval"] == [4, None] and search["confidence"] == 0.95
    assert search["labels"] == ["c0001", "c0001-rep1", "c0002", "c0002-rep1", "c0004", "c0004-rep1"]
    assert search["bracket"][0] == 4 and [p["value"] for p in search["probes"]] == [1, 2, 4]  # bracket and probes
    assert (run_dir / "points" / "c0004-rep1.json").is_file() and search["uncertain"] == []  # a re-measurement
    for probe in search["probes"]:
        assert probe["labels"] == [f"c{int(probe['value']):04d}", f"c{int(probe['value']):04d}-rep1"]
        assert (probe["good"], probe["judged"], probe["attainment"], probe["verdict"]) == (40, 40, 1.0, "pass")
        assert [probe["ci_low"], probe["ci_high"]] == pytest.approx([40 / (40 + 1.9599640**2), 1.0], abs=1e-6)
        assert [m["judged"] for m in probe["measurements"]] == [20, 20]
    assert len(sweep.load_results(run_dir).points) == 6


def test_repeats_combine_with_the_search(mock: ServerProcess, tmp_path: Path) -> None:
    """--repeats 2: every probe starts with two pooled measurements, so 20 + 20 good requests pass at once."""
    console = Console(file=io.StringIO(), width=300)
    cfg = config(mock, tmp_path / "search", values=[1], max_load_under_slo=True, max_load=2, num_warmups=0,
                 num_prompts=20, repeats=2)
    with Sweeper(cfg, console) as sweeper:
        sweeper.run()
    search = json.loads((cfg.output_dir / "search.json").read_text())
    assert search["labels"] == ["c0001", "c0001-rep1", "c0002", "c0002-rep1"]
    assert [(p["judged"], p["verdict"]) for p in search["probes"]] == [(40, "pass"), (40, "pass")]
    assert "max load under SLO: 2 streams (95 % interval 2–?" in console.file.getvalue()
    assert sorted(sweep.load_results(cfg.output_dir).points["label"]) == search["labels"]  # every point readable


def test_launched_server_dying_fails_the_sweep_with_its_log(tmp_path: Path) -> None:
    template = f"{shlex.quote(sys.executable)} -m sweep.mock.server --port {{port}} --ttft-ms 1 --itl-ms 1"
    cfg = config(None, tmp_path / "run", launch_template=template, num_warmups=0, num_prompts=3)
    with Sweeper(cfg) as sweeper:
        assert sweeper.measure(1)["completed"] == 3
        assert sweeper.writer.config["target"]["url"] == sweeper.server.url  # the launched port is recorded
        sweeper.server.process.kill()
        sweeper.server.process.wait()
        with pytest.raises(RuntimeError, match="exited with code -9"):
            sweeper.measure(4)
    assert [p.name for p in (tmp_path / "run" / "points").iterdir()] == ["c0001.json"]
    assert "sweep.mock.server" in (tmp_path / "run" / "server.log").read_text()


def test_client_fidelity_audits_token_counts() -> None:
    from sweep.point.records import RequestRecord
    from sweep.point.runner import PointRun, PointSpec
    from sweep.run.run_info import client_fidelity

    def rec(index: int, chunks: list[int], usage: int | None, retokenized: int) -> RequestRecord:
        r = RequestRecord(index, 4, sum(chunks), intended_send_time=0.0, send_time=0.25, success=True)
        r.chunk_times, r.chunk_tokens = [1.0 + i for i in range(len(chunks))], chunks
        r.usage_output_tokens, r.client_output_tokens = usage, retokenized
        return r

    records = [rec(0, [1, 1, 1], 3, 3), rec(1, [2, 2], 4, 5), rec(2, [1, 1], None, 4)]
    run = PointRun(PointSpec("c0001", "concurrency", 1, num_prompts=3), records, [], [], 0.0, 1.0)
    out = client_fidelity(run)
    assert out["usage_reported"] == 2 and out["output_token_discrepancy_over_10pct"] == 1  # 5 vs 4
    assert out["output_token_discrepancy_mean"] == pytest.approx(0.125)
    assert out["chunk_token_sum_mismatch"] == 0 and out["tokens_per_chunk_mean"] == pytest.approx(7 / 5)
    assert out["chunks_vs_retokenized_mismatch"] == 1 and out["retokenized_tokens_per_chunk_mean"] == 2.0
    assert out["send_lag"]["p50_ms"] == pytest.approx(250.0)


def test_fit_report_lands_in_fidelity(mock: ServerProcess, tmp_path: Path) -> None:
    workload = WorkloadConfig(workload="fixed", input_len=100, output_len=8, max_model_len=64, fit_policy="clip")
    run_dir = run_sweep(config(mock, tmp_path / "fit", values=[2], workload=workload, num_prompts=4, num_warmups=0))
    point = json.loads((run_dir / "points" / "c0002.json").read_text())
    assert point["fidelity"]["fit"]["policy"] == "clip" and point["fidelity"]["fit"]["changed"] == 4
    assert point["total_input_tokens"] + point["total_output_tokens"] <= 4 * 64  # every request fits the context


def test_a_trace_file_workload(mock: ServerProcess, tmp_path: Path) -> None:
    trace = tmp_path / "mine.csv"
    trace.write_text("input_len,output_len,timestamp\n12,3,0.0\n20,5,0.5\n31,2,1.25\n")
    workload = WorkloadConfig(workload=str(trace), seed=3)
    run_dir = run_sweep(config(mock, tmp_path / "trace", values=[2], workload=workload, num_prompts=6, num_warmups=0))
    requests = sweep.load_results(run_dir).requests
    assert len(requests) == 6 and requests["success"].all()
    pairs = set(zip(requests["requested_input_len"], requests["requested_output_len"], strict=True))
    assert pairs <= {(12, 3), (20, 5), (31, 2)}  # the lengths come from the trace file


def test_requests_still_waiting_for_a_slot_at_the_end_are_recorded_as_not_sent(
    mock: ServerProcess, tmp_path: Path
) -> None:
    """Overload: 400 req/s offered through one slot (~10 ms per request) for 0.5 s. The old runner dropped the
    requests still queued at the stop, so attainment stayed at 1.0; every due request must be accounted for."""
    cfg = config(mock, tmp_path / "over", mode="rate", values=[400.0], max_concurrency=1, num_prompts=None,
                 duration=0.5, num_warmups=0, warmup_seconds=0.1, cooldown_seconds=0.05)
    run_dir = run_sweep(cfg)
    results = sweep.load_results(run_dir)
    steady, rows = results.points.iloc[0], results.requests
    point = steady["full"]  # the whole point's figures; the reported ones are the steady window's
    assert point["not_sent"] > 0 and point["failed"] == 0
    assert point["completed"] + point["not_sent"] == len(rows) == steady["num_prompts"] + point["not_sent"]
    unsent = rows[~rows["sent"]]
    assert len(unsent) == point["not_sent"] and unsent["error"].str.startswith("NotSent").all()
    first_send = rows.loc[rows["sent"], "send_time"].min()
    assert (unsent["intended_send_time"] < first_send + results.config["sweep"]["duration"]).all()  # all were due
    assert point["slo_attainment"] == pytest.approx(point["completed"] / len(rows)) and point["slo_attainment"] < 0.9
    assert (steady["window"], steady["window_rule"]) == ("steady", "fixed")
    assert (steady["window_start_s"], steady["window_end_s"]) == pytest.approx((0.1, point["duration"] - 0.05))
    assert steady["duration"] == pytest.approx(point["duration"] - 0.15)
    assert 0 < steady["completed"] < point["completed"] and 0 < steady["not_sent"] < point["not_sent"]
    inside = rows[rows["in_window"].astype(bool)]
    assert len(inside) == steady["completed"] + steady["not_sent"]
    assert steady["slo_attainment"] == pytest.approx(steady["completed"] / len(inside))
    with open(run_dir / "summary.csv") as f:  # summary.csv reports the window's figures, and says so
        (summary,) = list(csv.DictReader(f))
    assert summary["window"] == "steady" and int(summary["completed"]) == steady["completed"]
    assert float(summary["slo_attainment"]) == pytest.approx(steady["slo_attainment"])
    from reports.importers import load_run

    run = load_run(run_dir)  # reports and the gate read only the rows inside the window
    assert len(run.requests) == len(inside)


def test_cancelled_requests_in_a_sweep(mock: ServerProcess, tmp_path: Path) -> None:
    """--cancel-rate 0.5 --cancel-after 2tok: half the requests (seeded) are aborted after 2 tokens; the point
    counts them as cancelled (not failed), its rows say so, and summary.csv and the report table show them."""
    from reports.importers import load_run
    from reports.tables import point_table
    from sweep.point.cancel import CancelAfter, CancelConfig

    cancel = CancelConfig(0.5, CancelAfter(tokens=2))
    cfg = config(mock, tmp_path / "cancel", values=[2], workload=WorkloadConfig(workload="fixed", input_len=16,
                 output_len=8, seed=1), num_warmups=0, cancel=cancel)
    run_dir = run_sweep(cfg)
    results = sweep.load_results(run_dir)
    point, rows = results.points.iloc[0], results.requests
    assert (point["completed"], point["failed"], point["cancelled"]) == (4, 0, 4)
    assert rows["cancelled"].sum() == 4 and not rows.loc[rows["cancelled"], "success"].any()
    assert (rows.loc[rows["cancelled"], "output_tokens"] < 8).all()
    assert point["slo_attainment"] == 1.0  # the cancelled requests are out of the denominator
    assert results.config["sweep"]["cancel_rate"] == 0.5 and results.config["sweep"]["cancel_after"] == "2tok"
    with open(run_dir / "summary.csv") as f:
        assert int(next(csv.DictReader(f))["cancelled"]) == 4
    assert point_table(load_run(run_dir))["cancelled"].tolist() == [4]


def test_the_search_judges_loads_by_their_steady_windows(tmp_path: Path) -> None:
    # Its own slower mock: a request takes 40-70 ms, so a point at c=2 lasts at least 160 ms and a 60 ms cool-down
    # leaves a window. The last response ends the point, and only a stall of over 60 ms between its last token and
    # its end of stream could keep it inside the window (a 1 ms cool-down was not enough under a loaded CI machine).
    with start_mock(30.0, 5.0, tmp_path / "mock.log") as slow_mock:
        run_dir = run_sweep(config(slow_mock, tmp_path / "search", values=[1], max_load_under_slo=True, max_load=2,
                                   num_warmups=0, num_prompts=8, cooldown_seconds=0.06))
    search = json.loads((run_dir / "search.json").read_text())
    assert search["steady_window"] == "fixed" and search["labels"] == ["c0001", "c0002"]
    for label, probe in zip(search["labels"], search["probes"], strict=True):
        point = json.loads((run_dir / "points" / f"{label}.json").read_text())
        assert point["window"] == "steady" and probe["attainment"] == point["slo_attainment"]
        assert 0 < point["completed"] < point["full"]["completed"]


def test_a_url_target_is_priced_as_the_whole_instance_unless_its_devices_are_given(
    mock: ServerProcess, tmp_path: Path
) -> None:
    """Its knobs are unknown, so the sweep cannot count its GPUs; a caller that knows them (the tuner) says."""
    for devices, hourly in ((None, 8.0), (2, 2.0)):
        run_dir = run_sweep(config(mock, tmp_path / f"run{devices}", values=[1], num_prompts=2, num_warmups=0,
                                   cost_per_hour=8.0, gpus_per_instance=8, devices_used=devices))
        point = json.loads((run_dir / "points" / "c0001.json").read_text())
        assert (point["devices_used"], point["configuration_cost_per_hour"]) == (devices, hourly)
