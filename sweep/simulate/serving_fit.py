"""`bench lab profile-serving`: fit a profile's serving terms to measured `bench sweep` runs.

`bench model profile` times the model runner and the sampler; a served engine's step also pays the engine core around
them (scheduling, sampling metadata, the output queue) and, per streamed token, the API process (detokenisation,
SSE, HTTP), which on a CPU machine runs on the model's cores. Those costs are not a fudge factor on the step: they
are two measured terms of the cost model (engine/executor/cost_model.py), a fixed cost per step and a cost per
sequence in the step.

Fitting: every point of every calibration run is simulated as it was run (its workload, knobs and load, see
`simulate_like`), and the difference between its measured and predicted median TPOT is regressed on the
simulated point's mean running sequences, non-negatively and on relative error:

    TPOT_measured - TPOT_predicted = step_overhead + per_seq * running_seqs

A decode step's time is what a TPOT measures, so the terms are what each step is missing. Because queueing makes
the prediction non-linear in the step time, the fit is repeated on the refitted profile until the terms settle
(`rounds`). Calibrate on runs that the validation does not use.

The hand-over terms (the API process's time per request and per prompt token before a request reaches the
engine, sweep/simulate/api_process.py) are fitted first, from the runs' own timestamps rather than by simulation: each
request's client send time and the server's `received_time` (when the API process handed it to the engine, same
machine clock after `epoch_offset`) are replayed through the hand-over model, minimising the absolute error
(a request stalled by a new connection does not move the fit). With one prompt length in every run the per-token
term cannot be told from the per-request one and is 0. Runs without those timestamps leave the terms out.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sweep.simulate.simulation import Profile


@dataclass
class CalibrationPoint:
    run: str
    label: str
    measured_tpot_ms: float
    predicted_tpot_ms: float
    running_seqs: float
    measured_ttft_ms: float | None = None
    predicted_ttft_ms: float | None = None


def run_config(run_dir: Path) -> dict[str, Any]:
    config = json.loads((run_dir / "config.json").read_text())
    if config.get("simulated"):
        raise ValueError(f"{run_dir}: a simulated run; calibrate on measured `bench sweep` runs")
    if (config.get("target") or {}).get("backend") != "servelab":
        raise ValueError(f"{run_dir}: not a run of the built-in engine (target.backend must be 'servelab')")
    return config


def simulate_like(run_dir: Path, profile: Profile, output_dir: Path) -> dict[str, tuple[dict, dict]]:
    """Simulate every point of a measured run with `profile`, as it was run: label -> (measured, simulated)."""
    from rich.console import Console

    from sweep.point.runner import WorkloadConfig
    from sweep.simulate.simulation import SimulateConfig, Simulator

    config = run_config(run_dir)
    target, sweep = config["target"], config["sweep"]
    fields = {f.name for f in dataclasses.fields(WorkloadConfig)}
    workload = WorkloadConfig(**{k: v for k, v in config["workload"].items() if k in fields})
    simulate_config = SimulateConfig(
        output_dir=output_dir,
        profile=profile,
        mode=sweep["mode"],
        values=[float(v) for v in sweep["values"]],
        engine_knobs={**target.get("engine_knobs", {}), "model": target["model"]},
        workload=workload,
        num_prompts=sweep.get("num_prompts"),
        duration=sweep.get("duration"),
        burstiness=sweep.get("burstiness", 1.0),
        max_concurrency=sweep.get("max_concurrency"),
        percentiles=list(config.get("percentiles") or [50, 90, 99]),
    )
    simulator = Simulator(simulate_config, console=Console(stderr=True, quiet=True))
    pairs = {}
    for path in sorted((run_dir / "points").glob("*.json")):
        measured = json.loads(path.read_text())
        value = measured.get("max_concurrency") if sweep["mode"] == "concurrency" else measured.get("request_rate")
        pairs[measured["label"]] = (measured, simulator.measure(float(value)))
    return pairs


def calibration_points(run_dirs: list[Path], profile: Profile, scratch: Path) -> list[CalibrationPoint]:
    points = []
    for index, run_dir in enumerate(run_dirs):
        for label, (measured, simulated) in simulate_like(run_dir, profile, scratch / f"run{index}").items():
            if not measured.get("median_tpot_ms") or not simulated.get("median_tpot_ms"):
                continue  # one-token outputs: no TPOT to fit
            points.append(
                CalibrationPoint(
                    str(run_dir), label, float(measured["median_tpot_ms"]), float(simulated["median_tpot_ms"]),
                    float(simulated["simulation"]["mean_running_seqs"]),
                    measured.get("median_ttft_ms"), simulated.get("median_ttft_ms"),
                )
            )  # fmt: skip
    return points


def fit_terms(points: list[CalibrationPoint]) -> dict[str, float]:
    """Non-negative (step_overhead, per_seq) seconds minimising the relative TPOT error of `points`."""
    from engine.executor.cost_model import nnls

    if not points:
        raise ValueError("no calibration point has a TPOT (every output was one token?)")
    x = np.array([[1.0, p.running_seqs] for p in points])
    residual = np.array([(p.measured_tpot_ms - p.predicted_tpot_ms) / 1e3 for p in points])
    weights = 1.0 / np.array([p.measured_tpot_ms / 1e3 for p in points])
    if len({p.running_seqs for p in points}) < 2:  # one load level: a per-step term only
        x = x[:, :1]
    terms = nnls(x * weights[:, None], residual * weights)
    return {"step_overhead": float(terms[0]), "per_seq": float(terms[1]) if len(terms) > 1 else 0.0}


@dataclass
class HandOverSample:
    """One measured point's requests: client send times, prompt tokens and hand-over times (seconds, one clock)."""

    send_times: list[float]
    prompt_tokens: list[int]
    handed_times: list[float]


def hand_over_samples(run_dirs: list[Path]) -> list[HandOverSample]:
    """Every point's successful requests that carry the server's `received_time` and `epoch_offset`."""
    samples = []
    for run_dir in run_dirs:
        run_config(run_dir)
        points: dict[str, HandOverSample] = {}
        with open(run_dir / "requests.jsonl") as rows:
            for line in rows:
                row = json.loads(line)
                timing = row.get("server_timing") or {}
                if not row.get("success") or timing.get("received_time") is None or not row.get("prompt_tokens"):
                    continue
                sample = points.setdefault(row["label"], HandOverSample([], [], []))
                sample.send_times.append(float(row["send_time"]))
                sample.prompt_tokens.append(int(row["prompt_tokens"]))
                sample.handed_times.append(float(timing["received_time"]) - float(timing.get("epoch_offset") or 0.0))
        samples += points.values()
    return samples


def fit_hand_over(samples: list[HandOverSample], iterations: int = 30) -> dict[str, float]:
    """Non-negative hand-over terms minimising the absolute error of the replayed hand-over times. The model is
    piecewise linear in the terms, so each iteration linearises it where it stands (finite differences) and
    solves a reweighted non-negative least squares (iteratively reweighted: an L1 fit)."""
    from engine.executor.cost_model import nnls
    from sweep.simulate.api_process import replay

    if not any(s.send_times for s in samples):
        raise ValueError("no request has the server's received_time: cannot fit the hand-over")
    one_length = len({n for s in samples for n in s.prompt_tokens}) < 2
    measured = np.concatenate([np.subtract(s.handed_times, s.send_times) for s in samples])

    def predict(a: float, b: float) -> np.ndarray:
        return np.concatenate([np.subtract(replay(s.send_times, s.prompt_tokens, a, b), s.send_times) for s in samples])

    columns = 1 if one_length else 2  # the terms fitted; the per-token term stays 0 with one prompt length
    terms = np.array([1e-3, 0.0])
    for _ in range(iterations):
        base, step = predict(*terms), 1e-7
        jacobian = np.stack([(predict(*(terms + step * unit)) - base) / step for unit in np.eye(2)[:columns]], axis=1)
        weights = np.sqrt(1.0 / np.maximum(np.abs(measured - base), 1e-4))
        target = measured - base + jacobian @ terms[:columns]
        new = np.concatenate([nnls(jacobian * weights[:, None], target * weights), np.zeros(2 - columns)])
        converged = np.abs(new - terms).max() < 1e-7
        terms = new
        if converged:
            break
    return {"hand_over_per_request": float(terms[0]), "hand_over_per_prompt_token": float(terms[1])}


def calibrate(profile: Profile, run_dirs: list[Path], rounds: int = 3) -> dict[str, Any]:
    """The profile's JSON with `cost_model.serving` fitted to `run_dirs` (the step terms, and the hand-over
    terms when the runs have the server's timestamps) and a `serving_calibration` record. The first round, the
    "before", simulates the bare profile; the later rounds and the "after" include the hand-over."""
    from engine.executor.cost_model import CostModel

    data = copy.deepcopy(profile.data)
    data["cost_model"].pop("serving", None)
    serving: dict[str, float] = {"step_overhead": 0.0, "per_seq": 0.0}
    samples = hand_over_samples(run_dirs)
    hand_over = fit_hand_over(samples) if any(s.send_times for s in samples) else {}
    history = []
    with tempfile.TemporaryDirectory(prefix="profile-serving-") as scratch:
        for round_index in range(rounds):
            terms = serving if round_index == 0 else {**serving, **hand_over}
            model = CostModel.from_dict({**data["cost_model"], "serving": terms})
            current = Profile(profile.path, {**data, "cost_model": model.to_dict()}, model)
            points = calibration_points(run_dirs, current, Path(scratch) / f"round{round_index}")
            history.append([dataclasses.asdict(p) for p in points])
            delta = fit_terms(points)
            serving = {k: max(serving[k] + delta[k], 0.0) for k in serving}
            if abs(delta["step_overhead"]) + abs(delta["per_seq"]) * 8 < 1e-4:  # < 0.1 ms at 8 sequences
                break
        model = CostModel.from_dict({**data["cost_model"], "serving": {**serving, **hand_over}})
        final = calibration_points(run_dirs, Profile(profile.path, data, model), Path(scratch) / "final")
    data["cost_model"] = model.to_dict()
    before, after = history[0], [dataclasses.asdict(p) for p in final]
    data["serving_calibration"] = {
        "runs": [str(r) for r in run_dirs],
        "terms": serving,
        "hand_over": hand_over or None,
        "hand_over_requests": sum(len(s.send_times) for s in samples),
        "points_before": before,
        "points_after": after,
        "tpot_mean_rel_error_before": mean_rel_error(before, "tpot"),
        "tpot_mean_rel_error_after": mean_rel_error(after, "tpot"),
        "ttft_mean_rel_error_before": mean_rel_error(before, "ttft"),
        "ttft_mean_rel_error_after": mean_rel_error(after, "ttft"),
    }
    return data


def mean_rel_error(points: list[dict[str, Any]], metric: str) -> float | None:
    """Mean relative error of the predicted median `metric` ("tpot" or "ttft") over the points that have both
    values (every calibration point has both TPOTs; None when no point has both)."""
    errors = []
    for point in points:
        predicted, measured = point[f"predicted_{metric}_ms"], point[f"measured_{metric}_ms"]
        if predicted is not None and measured:
            errors.append(abs(predicted - measured) / measured)
    return float(np.mean(errors)) if errors else None
