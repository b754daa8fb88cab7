"""`bench gate --metric itl_p99_<stat>` / `max_stall_<stat>`: each request's own p99 gap and longest gap (the
per-token SLOs' quantities) as gate metrics, and the spelling rules."""

from __future__ import annotations

import numpy as np
import pytest
from synthetic_runs import synthetic_run, synthetic_run_dir
from typer.testing import CliRunner

from cli import app
from reports.baseline import blessed_point_stats
from reports.gate import GateConfig, GateInputError, metric_samples, parse_metric, run_gate
from reports.recompute import records_from_rows
from sweep.point.benchmark_metrics import request_itl_p99, request_max_stall


def test_the_grammar_tells_per_request_gaps_from_pooled_itl() -> None:
    assert parse_metric("itl_p99_p95") == ("itl_p99", 95.0)  # p95 over requests of each one's own p99 gap
    assert parse_metric("ITL_P99_median") == ("itl_p99", 50.0)
    assert parse_metric("itl_p99_mean") == ("itl_p99", "mean")
    assert parse_metric("itl_p99") == ("itl", 99.0)  # vLLM's pooled p99_itl_ms, as before
    assert parse_metric("max_stall_p99.9") == ("max_stall", 99.9)
    for bad in ("itl_p90_p95", "itl_p99_max", "max_stall", "stall_p99", "itl_p99_p101", "request_itl_p99_p95"):
        with pytest.raises(GateInputError) as error:
            parse_metric(bad)
        if bad != "itl_p99_p101":  # that one is a percentile out of range
            message = str(error.value)
            assert f"unknown gate metric {bad!r}" in message
            for spelling in ("ttft_<stat>", "itl_<stat>", "itl_p99_<stat>", "max_stall_<stat>", "failure_rate"):
                assert spelling in message


def test_samples_are_the_slo_s_own_per_request_values() -> None:
    run = synthetic_run("base", seed=7, loads=[2], num_prompts=30)
    samples = metric_samples(run, "c0002", {"itl_p99", "max_stall", "itl"})
    records = [r for r in records_from_rows(run.point_requests("c0002")) if r.success and len(r.itl) > 0]
    assert samples["itl_p99"] == pytest.approx([request_itl_p99(r) * 1000 for r in records])
    assert samples["max_stall"] == pytest.approx([request_max_stall(r) * 1000 for r in records])
    assert samples["itl"].size == sum(len(r.itl) for r in records)  # pooled: every gap, a different quantity
    stats = blessed_point_stats(run)["c0002"]  # the store's history can give the new metric a noise floor
    assert stats["itl_p99_p95"] == pytest.approx(np.percentile(samples["itl_p99"], 95))


def test_gate_on_each_request_s_p99_gap() -> None:
    config = GateConfig(metrics=("itl_p99_p90", "itl_p99_median"), max_regression=0.05)
    baseline = synthetic_run("base", seed=11, loads=[1, 4], num_prompts=80)
    same = run_gate(baseline, synthetic_run("same", seed=12, loads=[1, 4], num_prompts=80), config)
    assert same.passed and {c.metric for c in same.comparisons} == {"itl_p99_p90", "itl_p99_median"}
    slower = run_gate(baseline, synthetic_run("slower", seed=12, loads=[1, 4], num_prompts=80, tpot_scale=1.3), config)
    assert not slower.passed and all(c.failed and c.change > 0.15 for c in slower.comparisons)


def test_cli_takes_the_spelling_and_refuses_a_bad_one(tmp_path) -> None:
    base = synthetic_run_dir(tmp_path / "base", seed=4, loads=[1], num_prompts=40)
    runner = CliRunner()
    common = ["gate", "--baseline", str(base), "--candidate", str(base), "--noise-floor", "5%"]
    result = runner.invoke(app, [*common, "--metric", "itl_p99_p95,max_stall_p99"])
    assert result.exit_code == 0 and "| c0001 | itl_p99_p95 |" in result.output, result.output
    result = runner.invoke(app, [*common, "--metric", "itl_p99_p95,stall_p99"])
    assert result.exit_code == 2 and "itl_p99_<stat> (each request's own p99 chunk gap" in result.output
