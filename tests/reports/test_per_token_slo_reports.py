"""Per-token SLOs in the reports: recomputed goodput, the per-request gap columns, the point table and `bench gate`."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from synthetic_runs import synthetic_run

from reports.gate import GateConfig, GateInputError, parse_metric, run_gate
from reports.recompute import format_slo, goodput, normalize_slo, request_latencies
from reports.tables import point_table
from sweep.point.records import RequestRecord


def _rows(chunk_lists: list[list[float]]) -> pd.DataFrame:
    rows = []
    for i, chunks in enumerate(chunk_lists):
        r = RequestRecord(index=i, requested_input_len=8, requested_output_len=len(chunks), intended_send_time=0.0)
        r.success, r.chunk_times, r.chunk_tokens = True, chunks, [1] * len(chunks)
        r.first_token_time, r.last_token_time, r.end_time = chunks[0], chunks[-1], chunks[-1]
        r.output_tokens, r.prompt_tokens = len(chunks), 8
        rows.append(r.to_row("c0001"))
    return pd.DataFrame(rows)


def test_recompute_takes_the_new_keys_and_gives_per_request_columns() -> None:
    rows = _rows([[0.1, 0.2, 0.5], [0.1, 0.15], [0.3]])  # longest gaps 300, 50 ms; one chunk: none
    latencies = request_latencies(rows)
    assert latencies["max_stall_ms"].tolist()[:2] == pytest.approx([300.0, 50.0])
    assert np.isnan(latencies["max_stall_ms"].iloc[2]) and np.isnan(latencies["itl_p99_ms"].iloc[2])
    assert latencies["itl_p99_ms"].iloc[0] == pytest.approx(100.0 + 0.99 * 200.0)
    assert goodput(rows, 1.0, {"max_stall": 100}) == (pytest.approx(2.0), pytest.approx(2 / 3))
    assert goodput(rows, 1.0, {"itl_p99_ms": 297}) == (pytest.approx(2.0), pytest.approx(2 / 3))
    assert goodput(rows, 1.0, {"itl_p99_ms": 299}) == (pytest.approx(3.0), pytest.approx(1.0))
    assert format_slo(normalize_slo({"max_stall": 100})) == "MAX_STALL <= 100 ms"
    with pytest.raises(ValueError, match="expected one of ttft, tpot, e2el, itl_p99, max_stall"):
        normalize_slo({"stall": 100})


def test_point_table_shows_the_stall_tail() -> None:
    run = synthetic_run("base", seed=3, loads=[1, 2], num_prompts=10)
    stalls = run.points["p99_max_stall_ms"].tolist()  # the points' metrics record the distribution
    assert all(s > 0 for s in stalls) and point_table(run)["max stall p99 ms"].tolist() == stalls
    run.points = run.points.drop(columns=[c for c in run.points if "max_stall" in c])
    assert "max stall p99 ms" not in point_table(run)  # a stored run from before the field: no column


def test_gate_compares_the_max_stall() -> None:
    assert parse_metric("max_stall_p99") == ("max_stall", 99.0)
    assert parse_metric("max_stall_median") == ("max_stall", 50.0)
    with pytest.raises(GateInputError, match="max_stall"):
        parse_metric("stall_p99")
    config = GateConfig(metrics=("max_stall_p90",), max_regression=0.05)
    baseline = synthetic_run("base", seed=11, loads=[1, 4], num_prompts=80)
    assert run_gate(baseline, synthetic_run("same", seed=12, loads=[1, 4], num_prompts=80), config).passed
    slower = synthetic_run("slower", seed=12, loads=[1, 4], num_prompts=80, tpot_scale=1.3)
    result = run_gate(baseline, slower, config)
    assert not result.passed and all(c.failed and c.change > 0.1 for c in result.comparisons)
