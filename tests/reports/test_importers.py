"""Importers: sweep run directories, vLLM `bench serve --save-detailed` JSONs, GuideLLM reports."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

from reports.importers import RunInputError, load_run, load_runs, point_label
from reports.recompute import request_latencies

VLLM_FIELDS = ("median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p90_tpot_ms", "median_itl_ms", "p99_e2el_ms")


def test_point_labels():
    assert point_label(16, "inf") == "c0016"
    assert point_label(None, 2.0) == "r0002.00"
    assert point_label(None, "inf") == "rinf"


def test_sweep_run_dir(fixture_run):
    run = load_run(fixture_run)
    assert run.source == "servelab" and run.mode == "concurrency"
    assert list(run.points["label"]) == ["c0001", "c0002", "c0004", "c0008"]
    assert set(run.requests["label"]) == set(run.points["label"])
    assert (run.points["completed"] + run.points["failed"] == run.requests.groupby("label").size().to_numpy()).all()


def test_vllm_result_recomputes_to_vllms_own_figures(fixtures_dir):
    path = fixtures_dir / "vllm_c0002.json"
    data = json.loads(path.read_text())
    run = load_run(path)
    assert run.source == "vllm" and run.mode == "concurrency"
    assert list(run.points["label"]) == ["c0002"]
    rows = run.requests
    assert len(rows) == len(data["ttfts"]) and rows["success"].sum() == data["completed"]
    assert rows.loc[~rows["success"], "error"].tolist() == ["Bad Request"]
    from reports.recompute import point_metrics

    recomputed = point_metrics(rows, data["duration"], (50, 90, 99))
    for field in VLLM_FIELDS:
        assert recomputed[field] == pytest.approx(data[field], rel=1e-9), field
    assert recomputed["total_output_tokens"] == data["total_output_tokens"]


def test_folder_of_vllm_results_is_one_sweep(tmp_path, fixtures_dir):
    for name in ("vllm_c0002.json", "vllm_c0004.json"):
        shutil.copy(fixtures_dir / name, tmp_path / name)
    run = load_run(tmp_path)
    assert list(run.points["label"]) == ["c0002", "c0004"]
    assert run.requests.groupby("label").size().tolist() == [8, 8]


def test_guidellm_report(fixtures_dir):
    path = fixtures_dir / "guidellm_report.json"
    data = json.loads(path.read_text())
    run = load_run(path)
    assert run.source == "guidellm"
    assert sorted(run.points["label"]) == ["c0002", "r0003.00"]
    point = run.points.set_index("label").loc["c0002"]
    assert (point["completed"], point["failed"], point["incomplete"]) == (6, 1, 1)
    assert math.isnan(point["median_itl_ms"])  # GuideLLM keeps no chunk gaps
    bench = next(b for b in data["benchmarks"] if b["config"]["strategy"]["type_"] == "concurrent")
    rows = run.point_requests("c0002")
    lat = request_latencies(rows[rows["success"]])
    expected_ttft = [r["time_to_first_token_ms"] for r in bench["requests"]["successful"]]
    np.testing.assert_allclose(lat["ttft_ms"], expected_ttft)
    # GuideLLM's inter_token_latency_ms = (last - first) / (n - 1) equals vLLM's TPOT when E2EL ends at the last token
    expected_tpot = [r["inter_token_latency_ms"] for r in bench["requests"]["successful"]]
    np.testing.assert_allclose(lat["tpot_ms"], expected_tpot)


def test_unusable_inputs(tmp_path, fixtures_dir):
    with pytest.raises(RunInputError, match="no such file"):
        load_run(tmp_path / "missing")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(RunInputError, match="not valid JSON"):
        load_run(tmp_path / "bad.json")
    data = json.loads((fixtures_dir / "vllm_c0002.json").read_text())
    for key in ("ttfts", "itls", "errors", "input_lens", "output_lens", "start_times", "generated_texts"):
        data.pop(key)
    (tmp_path / "plain.json").write_text(json.dumps(data))
    with pytest.raises(RunInputError, match="--save-detailed"):
        load_run(tmp_path / "plain.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunInputError, match="neither a sweep run directory"):
        load_run(tmp_path / "empty")
    run_dir = tmp_path / "run"
    shutil.copytree(fixtures_dir / "sweep_a", run_dir)
    (run_dir / "requests.jsonl").unlink()
    with pytest.raises(RunInputError, match="requests.jsonl"):
        load_run(run_dir)


def test_load_runs_gives_unique_names(fixture_run):
    runs = load_runs([fixture_run, fixture_run])
    assert len({r.name for r in runs}) == 2
    assert all((r.requests["run"] == r.name).all() for r in runs)
