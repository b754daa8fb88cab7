"""bench lab profile-serving: the serving terms fitted to measured runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sweep.point.runner import WorkloadConfig
from sweep.simulate.api_process import replay
from sweep.simulate.serving_fit import (
    CalibrationPoint,
    HandOverSample,
    calibrate,
    fit_hand_over,
    fit_terms,
    hand_over_samples,
)
from sweep.simulate.simulation import SimulateConfig, load_profile, run_simulation


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


def synthetic_samples(per_request: float, per_prompt_token: float) -> list[HandOverSample]:
    """Bursts and lone requests of several prompt lengths, handed over exactly as the model says."""
    points = [([0.0] * 4, [128] * 4), ([0.0, 0.0, 0.0], [1536, 512, 64]), ([0.0, 1.0, 2.0], [2000, 16, 700])]
    return [
        HandOverSample(sends, lengths, replay(sends, lengths, per_request, per_prompt_token))
        for sends, lengths in points
    ]


def test_fit_hand_over_recovers_known_terms_despite_a_stalled_request() -> None:
    samples = synthetic_samples(0.0012, 6.5e-6)
    samples[0].handed_times[0] += 0.150  # a new connection's stall: one request, far off
    fitted = fit_hand_over(samples)
    assert fitted == pytest.approx({"hand_over_per_request": 0.0012, "hand_over_per_prompt_token": 6.5e-6}, rel=0.01)
    one_length = [HandOverSample([0.0, 0.0], [128, 128], replay([0.0, 0.0], [128, 128], 0.002, 0.0))]
    assert fit_hand_over(one_length) == pytest.approx({"hand_over_per_request": 0.002, "hand_over_per_prompt_token": 0})


def test_hand_over_samples_read_the_server_s_received_time(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"target": {"backend": "servelab"}}))
    rows = [
        {"label": "c2", "success": True, "send_time": 10.0, "prompt_tokens": 128,
         "server_timing": {"received_time": 1010.004, "epoch_offset": 1000.0}},
        {"label": "c2", "success": False, "send_time": 10.0, "prompt_tokens": 128, "server_timing": None},
        {"label": "c2", "success": True, "send_time": 10.5, "prompt_tokens": 64, "server_timing": {}},
    ]  # fmt: skip
    (tmp_path / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (sample,) = hand_over_samples([tmp_path])
    assert sample.send_times == [10.0] and sample.prompt_tokens == [128]
    assert sample.handed_times == pytest.approx([10.004])


def test_calibrate_fits_the_hand_over_from_the_runs_timestamps(tmp_path: Path) -> None:
    """A "measured" run simulated with a known hand-over, its rows given the server's received_time (the
    simulated hand-over): calibrating the bare profile finds the hand-over and predicts the run's TTFT."""
    base = {
        "kind": "servelab-step-profile", "knobs": {"model": "tiny-random", "dtype": "float32"},
        "kv_cache": {"tokens": 4096}, "cost_model": {"coefficients": {"overhead": 0.01, "tokens": 0.001}},
    }  # fmt: skip
    serving = {"step_overhead": 0.004, "per_seq": 0.002, "hand_over_per_request": 0.003}
    truth = {**base, "cost_model": {**base["cost_model"], "serving": serving}}
    (tmp_path / "base.json").write_text(json.dumps(base))
    (tmp_path / "truth.json").write_text(json.dumps(truth))
    config = SimulateConfig(
        output_dir=tmp_path / "measured", profile=load_profile(tmp_path / "truth.json"), values=[1, 4],
        engine_knobs={"max_model_len": 128}, workload=WorkloadConfig(workload="random", input_len=16, output_len=8),
        num_prompts=8,
    )  # fmt: skip
    run = run_simulation(config)
    data = json.loads((run / "config.json").read_text())
    data["simulated"], data["target"]["backend"] = False, "servelab"
    (run / "config.json").write_text(json.dumps(data))
    rows = [json.loads(line) for line in (run / "requests.jsonl").read_text().splitlines()]
    for row in rows:
        row["server_timing"] |= {"received_time": row["server_timing"]["arrival_time"] + 5000.0, "epoch_offset": 5000.0}
    (run / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    calibrated = calibrate(load_profile(tmp_path / "base.json"), [run])
    fitted = calibrated["cost_model"]["serving"]
    assert fitted["hand_over_per_request"] == pytest.approx(0.003, rel=1e-3)
    assert fitted["hand_over_per_prompt_token"] == 0.0  # one prompt length: the per-request term alone
    record = calibrated["serving_calibration"]
    assert record["hand_over_requests"] == 16
    assert record["ttft_mean_rel_error_before"] > 0.05 and record["ttft_mean_rel_error_after"] < 0.02
