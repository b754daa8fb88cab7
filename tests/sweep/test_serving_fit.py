"""bench profile-serving: the serving terms fitted to measured runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sweep.runner import WorkloadConfig
from sweep.serving_fit import CalibrationPoint, calibrate, fit_terms
from sweep.simulate_run import SimulateConfig, load_profile, run_simulation


def test_fit_terms_recovers_a_per_step_and_a_per_sequence_cost() -> None:
    points = [
        CalibrationPoint("r", f"c{n}", measured_tpot_ms=10 + n + 2 + 0.5 * n, predicted_tpot_ms=10 + n, running_seqs=n)
        for n in (1, 4, 8)
    ]
    assert fit_terms(points) == pytest.approx({"step_overhead": 0.002, "per_seq": 0.0005})
    assert fit_terms(points[:1]) == pytest.approx({"step_overhead": 0.0025, "per_seq": 0.0})  # one load level


def test_calibrate_recovers_the_terms_of_a_run_made_with_them(tmp_path: Path) -> None:
    """A "measured" run that is a simulation with known serving terms: calibrating the bare profile on it finds
    them again, and the calibrated profile predicts its TPOT."""
    base = {
        "kind": "servelab-step-profile", "knobs": {"model": "tiny-random", "dtype": "float32"},
        "kv_cache": {"tokens": 4096}, "cost_model": {"coefficients": {"overhead": 0.01, "tokens": 0.001}},
    }  # fmt: skip
    truth = {**base, "cost_model": {**base["cost_model"], "serving": {"step_overhead": 0.004, "per_seq": 0.002}}}
    (tmp_path / "base.json").write_text(json.dumps(base))
    (tmp_path / "truth.json").write_text(json.dumps(truth))
    config = SimulateConfig(
        output_dir=tmp_path / "measured",
        profile=load_profile(tmp_path / "truth.json"),
        values=[1, 4],
        engine_knobs={"max_model_len": 128},
        workload=WorkloadConfig(workload="random", input_len=16, output_len=8),
        num_prompts=8,
    )
    run = run_simulation(config)
    data = json.loads((run / "config.json").read_text())  # made to look measured by the built-in engine
    data["simulated"], data["target"]["backend"] = False, "servelab"
    (run / "config.json").write_text(json.dumps(data))

    calibrated = calibrate(load_profile(tmp_path / "base.json"), [run])
    assert calibrated["cost_model"]["serving"] == pytest.approx({"step_overhead": 0.004, "per_seq": 0.002}, rel=0.05)
    record = calibrated["serving_calibration"]
    assert record["tpot_mean_rel_error_before"] > 0.2 and record["tpot_mean_rel_error_after"] < 0.02


def test_calibrate_refuses_a_simulated_run(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text(json.dumps({"simulated": True}))
    (tmp_path / "p.json").write_text(json.dumps({
        "kind": "servelab-step-profile", "knobs": {"model": "tiny-random"}, "cost_model": {"coefficients": {}},
    }))  # fmt: skip
    with pytest.raises(ValueError, match="simulated run"):
        calibrate(load_profile(tmp_path / "p.json"), [tmp_path / "run"])
