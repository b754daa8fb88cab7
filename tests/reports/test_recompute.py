"""Point metrics recomputed from stored rows (vLLM's definitions), against hand-computed values."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from reports.importers import load_run
from reports.recompute import (
    good_mask,
    goodput,
    normalize_slo,
    parse_slo,
    point_metrics,
    records_from_rows,
    request_latencies,
    with_slo,
)
from sweep.point.records import RequestRecord


def _row(index, ok, send, first=None, chunks=(), out=0, prompt=10, intended=None):
    chunks = list(chunks)
    return {"label": "c0001", "index": index, "success": ok, "error": None if ok else "boom",
            "intended_send_time": send if intended is None else intended, "send_time": send,
            "first_token_time": first, "last_token_time": chunks[-1] if chunks else None,
            "end_time": (chunks[-1] if chunks else send) + 0.001, "chunk_times": chunks, "chunk_tokens": [],
            "prompt_tokens": prompt, "output_tokens": out, "server_timing": None}


@pytest.fixture
def rows() -> pd.DataFrame:
    return pd.DataFrame([
        # 5 tokens in 3 chunks (multi-token chunks): TTFT 0.1, E2EL 0.5, TPOT (0.5-0.1)/4 = 0.1, gaps 0.1 and 0.3
        _row(0, True, 10.0, 10.1, [10.1, 10.2, 10.5], out=5),
        # one-token output: TTFT 0.2 = E2EL, no TPOT (counts as 0 for goodput)
        _row(1, True, 10.0, 10.2, [10.2], out=1),
        # 3 tokens: TTFT 0.05, E2EL 0.45, TPOT 0.2, gaps 0.2 and 0.2
        _row(2, True, 11.0, 11.05, [11.05, 11.25, 11.45], out=3),
        _row(3, False, 11.0, out=0),
    ])


def test_per_request_latencies_follow_vllm(rows):
    lat = request_latencies(rows)
    np.testing.assert_allclose(lat["ttft_ms"].to_numpy()[:3], [100, 200, 50], atol=1e-9)
    np.testing.assert_allclose(lat["e2el_ms"].to_numpy()[:3], [500, 200, 450], atol=1e-9)
    assert lat["tpot_ms"].iloc[0] == pytest.approx(100)
    assert math.isnan(lat["tpot_ms"].iloc[1])
    assert lat["tpot_ms"].iloc[2] == pytest.approx(200)
    assert lat["ttft_ms"].isna().iloc[3]


def test_point_metrics_hand_computed(rows):
    m = point_metrics(rows, duration=2.0, percentiles=(50, 99))
    assert (m["completed"], m["failed"]) == (3, 1)
    assert m["total_output_tokens"] == 9 and m["total_input_tokens"] == 30
    assert m["request_throughput"] == pytest.approx(1.5)
    assert m["output_throughput"] == pytest.approx(4.5)
    assert m["mean_ttft_ms"] == pytest.approx((100 + 200 + 50) / 3)
    assert m["median_tpot_ms"] == pytest.approx(150)  # over requests with 2+ tokens only
    assert m["mean_itl_ms"] == pytest.approx((100 + 300 + 200 + 200) / 4)  # pooled chunk gaps
    assert m["p50_e2el_ms"] == pytest.approx(450)
    assert m["request_goodput"] is None and m["slo_attainment"] is None


def test_goodput_and_attainment(rows):
    # TTFT <= 150 ms: requests 0 and 2 pass (1 fails TTFT, 3 failed) -> 2 good of 4
    assert list(good_mask(rows, {"ttft_ms": 150})) == [True, False, True, False]
    assert goodput(rows, 2.0, {"ttft": 150}) == (pytest.approx(1.0), pytest.approx(0.5))
    # TPOT <= 150 ms: request 1 has one token (TPOT 0, good), request 2 has TPOT 200 (bad)
    assert list(good_mask(rows, parse_slo("tpot=150"))) == [True, True, False, False]
    # every SLO must hold
    assert list(good_mask(rows, parse_slo("ttft=150,e2el=460"))) == [False, False, True, False]
    assert goodput(rows, 2.0, None) == (None, None)


def test_slo_parsing_and_normalising():
    assert parse_slo("ttft=200,tpot=50,e2el=1000") == {"ttft_ms": 200.0, "tpot_ms": 50.0, "e2el_ms": 1000.0}
    assert normalize_slo({"ttft": 200, "tpot_ms": 40, "e2el": None}) == {"ttft_ms": 200.0, "tpot_ms": 40.0}
    assert parse_slo(None) is None and normalize_slo({}) is None
    for bad in ("itl=5", "ttft", "ttft=abc", "ttft=-1"):
        with pytest.raises(ValueError):
            parse_slo(bad)
    with pytest.raises(ValueError):
        normalize_slo({"latency": 5})


def test_recompute_under_the_stored_slo_reproduces_the_run(fixture_run):
    run = load_run(fixture_run)
    assert run.slo is not None
    again = with_slo(run.points, run.requests, run.slo)
    np.testing.assert_allclose(again["request_goodput"], run.points["request_goodput"])
    np.testing.assert_allclose(again["slo_attainment"], run.points["slo_attainment"])
    looser = with_slo(run.points, run.requests, {"ttft_ms": 1e6})
    assert (looser["slo_attainment"] >= again["slo_attainment"]).all()
    expected = (run.points["completed"] / (run.points["completed"] + run.points["failed"])).to_numpy()
    np.testing.assert_allclose(looser["slo_attainment"], expected)  # failures always count as misses


def test_recomputation_reproduces_the_sweeps_own_points(fixtures_dir):
    run = load_run(fixtures_dir / "mock_sweep")  # written by `bench sweep` itself
    for _, point in run.points.iterrows():
        again = point_metrics(run.point_requests(point["label"]), point["duration"], run.percentiles, run.slo)
        shared = [k for k, v in again.items() if isinstance(v, (int, float)) and k in point and point[k] is not None]
        assert len(shared) > 40
        for key in shared:
            assert again[key] == pytest.approx(point[key], rel=1e-9, abs=1e-9), (point["label"], key)


def test_stored_rows_rebuild_the_records_that_wrote_them() -> None:
    """The results contract both ways: `RequestRecord.to_row` (the sweep) and `records_from_rows` (reports)."""
    written = [
        RequestRecord(0, 16, 4, intended_send_time=9.5, send_time=10.0, success=True, first_token_time=10.25,
                      last_token_time=10.75, end_time=10.8, chunk_times=[10.25, 10.5, 10.75], chunk_tokens=[2, 1, 1],
                      prompt_tokens=16, output_tokens=4, client_prompt_tokens=16, client_output_tokens=5,
                      server_timing={"arrival_time": 1.0}),
        RequestRecord(1, 16, 4, intended_send_time=9.5, send_time=10.0, end_time=10.1, error="HTTPStatus 500: boom",
                      prompt_tokens=16, output_tokens=0),
    ]
    rows = pd.DataFrame([json.loads(json.dumps(r.to_row("c0002"))) for r in written])
    assert records_from_rows(rows) == written
