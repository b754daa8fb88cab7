"""Between-run noise in the gate: hierarchical bootstrap coverage, the noise floor, history, machine speed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from synthetic_runs import synthetic_run

from reports.gate import GateConfig, compare_groups, run_gate
from reports.gate_noise import calibration_gap, history_noise_floor, nan_percentile
from reports.importers import RunData

METRICS = ("ttft_p90", "tpot_p50", "failure_rate")


def repeated_run(name: str, seeds: list[int], tpot_scales: list[float]) -> RunData:
    """Repeats of one synthetic sweep, each with its own TPOT level (the between-run drift)."""
    pairs = zip(seeds, tpot_scales, strict=True)
    parts = [synthetic_run(name, seed=s, tpot_scale=k, with_metrics=False) for s, k in pairs]
    requests = pd.concat([p.requests.assign(repeat=k) for k, p in enumerate(parts)], ignore_index=True)
    return RunData(name, parts[0].points, requests, parts[0].config)


def test_hierarchical_bootstrap_has_nominal_coverage_under_between_run_noise() -> None:
    """A/A runs of 3 repeats, between-run SD 10 % and within-run SD 30 %: the 90 % interval of the change covers 0
    in ~90 % of experiments; resampling requests alone (the old gate) covers it far less often."""
    rng = np.random.default_rng(7)
    config = GateConfig(alpha=0.1, n_boot=200)

    def side() -> list[np.ndarray]:
        return [10 * np.exp(0.1 * rng.standard_normal() + 0.3 * rng.standard_normal(20)) for _ in range(3)]

    experiments, covered, covered_flat = 200, 0, 0
    for _ in range(experiments):
        base, cand = side(), side()
        low, high = compare_groups(base, cand, 50.0, config, rng)[3:5]
        covered += low <= 0 <= high
        low, high = compare_groups([np.concatenate(base)], [np.concatenate(cand)], 50.0, config, rng)[3:5]
        covered_flat += low <= 0 <= high
    mc_error = 3 * math.sqrt(0.9 * 0.1 / experiments)
    assert abs(covered / experiments - 0.9) < mc_error
    assert covered_flat / experiments < 0.75


def test_noise_floor_widens_a_side_measured_once() -> None:
    base = synthetic_run("base", seed=1, with_metrics=False)
    drifted = synthetic_run("cand", seed=2, tpot_scale=1.12, with_metrics=False)  # 12 % slower, as drift can be
    config = GateConfig(metrics=METRICS, max_regression=0.05)
    strict = run_gate(base, drifted, config)
    assert not strict.passed
    assert any("no noise floor" in note for note in strict.notes)
    widened = run_gate(base, drifted, GateConfig(metrics=METRICS, max_regression=0.05, noise_floor=0.10))
    assert widened.passed
    assert {c.noise_floor for c in widened.comparisons if c.metric != "failure_rate"} == {0.10}
    assert any("measured once" in note and "10.0%" in note for note in widened.notes)


def test_repeats_carry_between_run_noise_and_still_catch_a_real_slowdown() -> None:
    base = repeated_run("base", [1, 2, 3], [1.0, 1.06, 0.95])
    same = repeated_run("same", [4, 5, 6], [1.04, 0.97, 1.08])
    slower = repeated_run("slower", [4, 5, 6], [1.4, 1.36, 1.45])
    config = GateConfig(metrics=METRICS, max_regression=0.10)
    result = run_gate(base, same, config)
    assert result.repeats == (3, 3) and result.passed and not result.notes
    assert not run_gate(base, slower, config).passed


def test_history_noise_floor_is_the_log_sd_of_blessed_runs(tmp_path: Path) -> None:
    base = synthetic_run("base", seed=1, with_metrics=False)
    values = [10.0, 11.0, 9.5, 10.5]
    with (tmp_path / "history.jsonl").open("w") as f:
        for v in values:
            stats = {label: {"tpot_median": v} for label in base.points["label"]}
            f.write(json.dumps({"point_stats": stats, "config": base.config}) + "\n")
        f.write(json.dumps({"point_stats": {"c0001": {"tpot_median": 50.0}}, "config": {"workload": {"x": 1}}}) + "\n")
    expected = float(np.std(np.log(values), ddof=1))
    floor, runs = history_noise_floor(tmp_path, "c0001", "tpot_median", lambda c: c == base.config)
    assert runs == 4 and floor == pytest.approx(expected)
    result = run_gate(base, synthetic_run("cand", seed=2, with_metrics=False), GateConfig(metrics=("tpot_p50",)),
                      store=tmp_path)
    assert [c.noise_floor for c in result.comparisons] == [pytest.approx(expected)] * len(result.comparisons)
    assert history_noise_floor(tmp_path, "c0001", "ttft_p90", lambda c: True) is None  # never recorded


def test_machine_speed_difference_is_reported() -> None:
    gap = calibration_gap({"cpu_gflops": 100.0, "x": "text"}, {"cpu_gflops": 80.0})
    assert gap == {"cpu_gflops": pytest.approx(-0.2)}
    base = synthetic_run("base", seed=1, with_metrics=False)
    cand = synthetic_run("cand", seed=2, with_metrics=False)
    base.config["calibration"] = {"speed": {"cpu_gflops": 100.0}, "client": {"ttft_error_p50_ms": 0.5}}
    cand.config["calibration"] = {"speed": {"cpu_gflops": 70.0}, "client": {"ttft_error_p50_ms": 1.5}}
    result = run_gate(base, cand, GateConfig(metrics=METRICS, max_regression=0.10, noise_floor=0.05))
    assert [note for note in result.notes if "differ in speed" in note and "cpu_gflops" in note]
    assert not [note for note in result.notes if "ttft_error" in note]  # timing errors are not speeds


@pytest.mark.parametrize("q", [0.0, 10.0, 50.0, 90.0, 99.0, 100.0])
def test_nan_percentile_equals_numpy(q: float) -> None:
    rng = np.random.default_rng(3)
    samples = rng.lognormal(size=(200, 37))
    samples[rng.random(samples.shape) < 0.3] = np.nan
    samples[5] = np.nan  # an all-NaN row
    samples[6, 1:] = np.nan  # a single value
    with np.errstate(all="ignore"), pytest.warns(RuntimeWarning):
        expected = np.nanpercentile(samples, q, axis=-1)
    np.testing.assert_array_equal(nan_percentile(samples, q), expected)
    np.testing.assert_array_equal(nan_percentile(samples[7], q), expected[7])
