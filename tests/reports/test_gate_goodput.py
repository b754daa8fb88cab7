"""`bench gate --slo`: request_goodput rows per point and class, judged by the latency rows' bootstrap; --json."""

from __future__ import annotations

import json

import numpy as np
import pytest
from synthetic_runs import synthetic_run, synthetic_run_dir
from typer.testing import CliRunner

from cli import app
from reports.gate import GateConfig, compare_groups, run_gate
from reports.gate_goodput import goodput_groups
from reports.gate_output import to_json, to_markdown
from reports.importers import RunData
from reports.recompute import goodput, normalize_slo, records_from_rows
from sweep.point.benchmark_metrics import class_metrics, parse_slo


def _classed(run: RunData) -> RunData:
    run.requests["request_class"] = np.where(run.requests["index"] % 2 == 0, "interactive", "batch")
    return run


def _slower_server(run: RunData, factor: float) -> RunData:
    """The same requests, served over `factor` times the duration: attainment unchanged, goodput / factor."""
    points = run.points.copy()
    points["duration"] = points["duration"] * factor
    return RunData(f"{run.name}-slow", points, run.requests.copy(), run.config)


def _rows(result, metric_prefix: str) -> dict:
    return {(c.point, c.metric): c for c in result.comparisons if c.metric.startswith(metric_prefix)}


SLO = normalize_slo(parse_slo("e2el=600000;interactive:ttft=30"))


def test_goodput_rows_equal_the_sweep_s_request_goodput_overall_and_per_class() -> None:
    run = _classed(synthetic_run("base", seed=3, loads=[1, 4], num_prompts=60))
    result = run_gate(run, run, GateConfig(metrics=("failure_rate",), slo=SLO, noise_floor=0.05))
    rows = _rows(result, "request_goodput")
    assert {metric for _, metric in rows} == {"request_goodput", "request_goodput[interactive]",
                                              "request_goodput[batch]"}  # fmt: skip
    for label in ("c0001", "c0004"):
        requests = run.point_requests(label)
        duration = float(run.points.set_index("label").loc[label, "duration"])
        assert rows[(label, "request_goodput")].baseline == pytest.approx(goodput(requests, duration, SLO)[0])
        per_class = class_metrics(records_from_rows(requests), duration, SLO)
        for name in ("interactive", "batch"):
            assert rows[(label, f"request_goodput[{name}]")].candidate == pytest.approx(
                per_class[name]["request_goodput"])
        assert rows[(label, "request_goodput")].n_baseline == 60
    assert result.passed  # identical runs


def test_a_throughput_drop_fails_on_goodput_alone() -> None:
    baseline = _classed(synthetic_run("base", seed=5, loads=[1, 2], num_prompts=200))
    slower = _slower_server(baseline, 1.4)
    config = GateConfig(metrics=("failure_rate",), slo=SLO)
    result = run_gate(baseline, slower, config)
    assert not result.passed
    attainment = _rows(result, "slo_attainment")
    assert attainment and not any(c.failed for c in attainment.values())  # the same requests met the SLO
    for (label, metric), row in _rows(result, "request_goodput").items():
        assert row.failed, (label, metric)
        assert row.change == pytest.approx(1 / 1.4 - 1) and row.ci_high < 0
    table = to_markdown(result, "base", "slow")
    assert "| c0001 | request_goodput[interactive] |" in table and " req/s |" in table and "❌ regression" in table
    assert "request_goodput (requests/s meeting it) on a significant drop above 5.0%" in table
    assert run_gate(baseline, slower, GateConfig(metrics=("failure_rate",), slo=SLO, max_goodput_drop=0.4)).passed
    faster = run_gate(baseline, _slower_server(baseline, 1 / 1.4), config)  # more goodput is no regression
    assert faster.passed and all(c.change > 0.3 for c in _rows(faster, "request_goodput").values())
    without_slo = run_gate(baseline, slower, GateConfig(metrics=("failure_rate",)))
    assert without_slo.passed and not _rows(without_slo, "request_goodput")


def test_a_drop_within_the_noise_floor_passes() -> None:
    baseline = synthetic_run("base", seed=5, loads=[1], num_prompts=200)
    slower = _slower_server(baseline, 1.1)
    slo = normalize_slo(parse_slo("e2el=600000"))
    plain = run_gate(baseline, slower, GateConfig(metrics=("failure_rate",), slo=slo))
    assert not plain.passed and any("request_goodput" in note for note in plain.notes)  # no floor: said so
    widened = run_gate(baseline, slower, GateConfig(metrics=("failure_rate",), slo=slo, noise_floor=0.3))
    (row,) = _rows(widened, "request_goodput").values()
    assert widened.passed and row.noise_floor == 0.3 and row.ci_low < -0.3


def test_repeats_use_each_repeat_s_duration() -> None:
    run = synthetic_run("base", seed=2, loads=[1], num_prompts=40)
    run.requests["repeat"] = np.where(run.requests["index"] < 20, 0, 1)
    run.points["repeats"] = [[{"duration": 2.0}, {"duration": 4.0}]]
    (first, second) = goodput_groups(run, "c0001", SLO, [None])[None]
    good = [int(goodput(rows, 1.0, SLO)[0]) for _, rows in run.requests.groupby("repeat")]
    assert first.mean() == pytest.approx(good[0] / 2.0) and second.mean() == pytest.approx(good[1] / 4.0)
    result = run_gate(run, run, GateConfig(metrics=("failure_rate",), slo=normalize_slo({"e2el": 600000})))
    (row,) = _rows(result, "request_goodput").values()
    assert result.passed and row.noise_floor is None and row.n_baseline == 40  # repeats: no floor needed
    assert row.baseline == pytest.approx((good[0] / 2.0 + good[1] / 4.0) / 2)  # 20 requests each


def test_the_p_value_is_for_a_drop() -> None:
    rng = np.random.default_rng(0)
    low, high = [rng.binomial(1, 0.5, 400).astype(float)], [rng.binomial(1, 0.9, 400).astype(float)]
    config = GateConfig(n_boot=500)
    assert compare_groups(high, low, "mean", config, rng, higher_is_better=True)[-1] < 0.01
    assert compare_groups(low, high, "mean", config, rng, higher_is_better=True)[-1] > 0.99
    assert compare_groups(low, high, "mean", config, rng)[-1] < 0.01  # latency: an increase is the regression


def test_cli_flags_and_json(tmp_path) -> None:
    base = synthetic_run_dir(tmp_path / "base", seed=4, loads=[1, 2], num_prompts=60)
    runner = CliRunner()
    common = ["gate", "--baseline", str(base), "--candidate", str(base), "--metric", "tpot_p50,failure_rate"]
    out = tmp_path / "gate.json"
    result = runner.invoke(app, [*common, "--slo", "e2el=600000", "--max-goodput-drop", "10%", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "| c0002 | request_goodput |" in result.output
    text = out.read_text()
    assert "NaN" not in text and "Infinity" not in text
    data = json.loads(text)
    assert data["passed"] is True and data["config"]["max_goodput_drop"] == pytest.approx(0.1)
    rows = {(r["point"], r["metric"]): r for r in data["comparisons"]}
    assert rows[("c0001", "request_goodput")]["unit"] == "requests/s; change relative"
    assert rows[("c0001", "request_goodput")]["baseline"] > 0 and ("c0002", "tpot_p50") in rows
    for bad in ("x", "-3%"):
        result = runner.invoke(app, [*common, "--slo", "e2el=600000", "--max-goodput-drop", bad])
        assert result.exit_code == 2 and "bad threshold" in result.output, result.output
    result = runner.invoke(app, [*common[:-1], "request_goodput", "--slo", "e2el=600000"])
    assert result.exit_code == 2 and "request_goodput and slo_attainment rows come with --slo" in result.output


def test_to_json_writes_no_nan() -> None:
    run = synthetic_run("base", seed=1, loads=[1], num_prompts=20)
    skipped = RunData("cand", run.points.copy(), run.requests.copy(), run.config)
    skipped.points["saturated"] = True  # a saturated row: NaN change and p-values
    data = to_json(run_gate(run, skipped, GateConfig(metrics=("failure_rate",))), "a", "b")
    (row,) = [r for r in data["comparisons"] if r["metric"] == "saturated"]
    assert row["change"] is None and row["failed"] is True and json.dumps(data, allow_nan=False)


def test_bench_compare_s_gate_judges_goodput_at_its_max_regression(tmp_path) -> None:
    import shutil

    from reports.compare import GateOptions, gate_targets

    base = synthetic_run_dir(tmp_path / "base", seed=4, loads=[1], num_prompts=200)
    slow = tmp_path / "slow"
    shutil.copytree(base, slow)
    for path in (slow / "points").glob("*.json"):  # the same requests over 1.4 x the time
        point = json.loads(path.read_text())
        path.write_text(json.dumps({**point, "duration": point["duration"] * 1.4}))
    slo = parse_slo("e2el=600000")
    (verdict,) = gate_targets({"base": base, "slow": slow}, GateOptions(metric="failure_rate", slo=slo))
    assert not verdict.passed and "| c0001 | request_goodput | " in verdict.table
    (verdict,) = gate_targets({"base": base, "slow": slow},
                              GateOptions(metric="failure_rate", slo=slo, max_regression="40%"))  # fmt: skip
    assert verdict.passed  # a 29 % drop is within a 40 % --max-regression
