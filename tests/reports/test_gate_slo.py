"""`bench gate --slo`: SLO attainment rows per point, overall and per request class, with per-token SLO keys."""

from __future__ import annotations

import numpy as np
import pytest
from synthetic_runs import synthetic_run, synthetic_run_dir
from typer.testing import CliRunner

from cli import app
from reports.gate import GateConfig, run_gate
from reports.gate_output import to_markdown
from reports.importers import RunData
from reports.recompute import SLOError, normalize_slo, request_latencies
from sweep.point.benchmark_metrics import parse_slo


def _classed(run: RunData) -> RunData:
    """Every other request `interactive`, the rest `batch`."""
    run.requests["request_class"] = np.where(run.requests["index"] % 2 == 0, "interactive", "batch")
    return run


def _stall_limit(run: RunData) -> float:
    """A max_stall limit that about 80 % of the run's requests meet."""
    stalls = request_latencies(run.requests)["max_stall_ms"].dropna()
    return float(np.percentile(stalls, 80))


def test_attainment_rows_per_class_pass_noise_and_fail_a_slower_class() -> None:
    baseline = _classed(synthetic_run("base", seed=11, loads=[1, 4], num_prompts=80))
    same = _classed(synthetic_run("same", seed=12, loads=[1, 4], num_prompts=80))
    slower = _classed(synthetic_run("slower", seed=12, loads=[1, 4], num_prompts=80, tpot_scale=1.3))
    limit = _stall_limit(baseline)
    slo = normalize_slo(parse_slo(f"e2el=600000;interactive:max_stall={limit:.3f}"))
    config = GateConfig(metrics=("failure_rate",), slo=slo)

    passed = run_gate(baseline, same, config)
    rows = {(c.point, c.metric): c for c in passed.comparisons}
    assert passed.passed
    for label in ("c0001", "c0004"):
        assert {"slo_attainment", "slo_attainment[interactive]", "slo_attainment[batch]"} <= {
            metric for point, metric in rows if point == label
        }
        # values are attainments (good / judged); failures are misses, so batch (any success is good) is below 1
        batch = rows[(label, "slo_attainment[batch]")]
        assert 0.9 <= batch.baseline <= 1.0 and batch.n_baseline == 40
        assert 0.6 <= rows[(label, "slo_attainment[interactive]")].baseline <= 0.95

    failed = run_gate(baseline, slower, config)
    rows = {(c.point, c.metric): c for c in failed.comparisons}
    assert not failed.passed
    for label in ("c0001", "c0004"):
        interactive = rows[(label, "slo_attainment[interactive]")]
        assert interactive.failed and interactive.change < -0.3 and interactive.ci_high < 0
        assert not rows[(label, "slo_attainment[batch]")].failed  # batch's SLO does not judge the stall
    table = to_markdown(failed, "base", "slower")
    assert "| c0001 | slo_attainment[interactive] |" in table and "% met" in table and " pp |" in table
    assert "SLO: E2EL <= 600000 ms; interactive: MAX_STALL <= " in table

    tolerant = run_gate(baseline, slower, GateConfig(metrics=("failure_rate",), slo=slo, max_attainment_drop=0.95,
                                                     max_goodput_drop=0.95))
    assert tolerant.passed  # the drops are significant but within --max-attainment-drop and --max-goodput-drop


def test_a_class_neither_run_carries_is_refused() -> None:
    baseline = _classed(synthetic_run("base", seed=1, loads=[1], num_prompts=10))
    config = GateConfig(metrics=("failure_rate",), slo=normalize_slo(parse_slo("chat:ttft=500")))
    with pytest.raises(SLOError, match=r"unknown class\(es\) \['chat'\]: their classes are \['batch', 'interactive'\]"):
        run_gate(baseline, baseline, config)


def test_cli_takes_per_token_slo_keys(tmp_path) -> None:
    base = synthetic_run_dir(tmp_path / "base", seed=4, loads=[1, 2], num_prompts=60)
    slow = synthetic_run_dir(tmp_path / "slow", seed=5, loads=[1, 2], num_prompts=60, tpot_scale=1.3)
    limit = _stall_limit(synthetic_run("base", seed=4, loads=[1, 2], num_prompts=60))
    runner = CliRunner()
    common = ["gate", "--baseline", str(base), "--metric", "failure_rate"]
    result = runner.invoke(app, [*common, "--candidate", str(slow), "--slo", f"max_stall={limit:.3f},itl_p99=1000"])
    assert result.exit_code == 1, result.output
    assert "| c0001 | slo_attainment |" in result.output and "❌ regression" in result.output
    result = runner.invoke(app, [*common, "--candidate", str(base), "--slo", f"max_stall={limit:.3f}"])
    assert result.exit_code == 0, result.output
    for bad, message in (("chat:ttft=5", "unknown class(es) ['chat']: their requests carry none"),
                         ("stall=5", "bad SLO item")):  # fmt: skip
        result = runner.invoke(app, [*common, "--candidate", str(base), "--slo", bad])
        assert result.exit_code == 2 and message in result.output, result.output
    result = runner.invoke(app, [*common, "--candidate", str(base), "--slo", "ttft=5", "--max-attainment-drop", "x"])
    assert result.exit_code == 2 and "bad threshold" in result.output


def test_bench_compare_s_gate_judges_the_attainment_under_the_sweep_s_slo(tmp_path) -> None:
    from reports.compare import GateOptions, gate_targets

    base = synthetic_run_dir(tmp_path / "base", seed=4, loads=[1, 2], num_prompts=60)
    slow = synthetic_run_dir(tmp_path / "slow", seed=5, loads=[1, 2], num_prompts=60, tpot_scale=1.3)
    limit = _stall_limit(synthetic_run("base", seed=4, loads=[1, 2], num_prompts=60))
    options = GateOptions(metric="failure_rate", slo=parse_slo(f"max_stall={limit:.3f}"))
    (verdict,) = gate_targets({"base": base, "slow": slow}, options)
    assert not verdict.passed and "| c0002 | slo_attainment |" in verdict.table
    (verdict,) = gate_targets({"base": base, "slow": slow}, GateOptions(metric="failure_rate"))
    assert verdict.passed and "slo_attainment" not in verdict.table  # without an SLO: no attainment rows
