"""`bench lab gate-study`'s analysis: subsets of a trial's requests, Wilson intervals, verdict rates per
gate variant."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from synthetic_runs import synthetic_run

from reports.gate_study import GateStudyConfig, analyse, read_trials, subset, variants, wilson
from reports.importers import RunData
from sweep.run.sweep_config import SweepConfig


def test_wilson_interval_matches_hand_computed_values() -> None:
    low, high = wilson(0, 20)
    assert low == 0.0 and high == pytest.approx(1.96**2 / (20 + 1.96**2))
    low, high = wilson(5, 10)
    half = 1.96 * math.sqrt(0.25 / 10 + 1.96**2 / 400) / (1 + 1.96**2 / 10)
    assert (low, high) == pytest.approx((0.5 - half, 0.5 + half))


def test_variants_cover_repeats_prompts_and_thresholds(tmp_path: Path) -> None:
    study = GateStudyConfig(SweepConfig(tmp_path, num_prompts=64, repeats=2), thresholds=(0.05, 0.10))
    names = [v.name for v in variants(study)]
    assert len(names) == 2 * 2 * 2 and "R=2, n=32, >10%" in names and "R=1, n=64, >5%" in names


def test_study_refuses_too_few_prompts(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="num-prompts"):
        GateStudyConfig(SweepConfig(tmp_path, num_prompts=4))


def _repeated(name: str, seed: int, scales: list[float], num_prompts: int) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    parts = [synthetic_run(name, seed=seed + k, tpot_scale=s, num_prompts=num_prompts, loads=[1, 2],
                           with_metrics=False)
             for k, s in enumerate(scales)]
    requests = pd.concat([p.requests.assign(repeat=k) for k, p in enumerate(parts)], ignore_index=True)
    points = parts[0].points.copy()
    points["repeats"] = [[{"duration": 10.0} for _ in scales] for _ in range(len(points))]
    for label in points["label"]:
        rows = requests[requests["label"] == label]
        tpot = ((rows["e2el"] - rows["ttft"]) / (rows["output_tokens"] - 1)).median() * 1000
        points.loc[points["label"] == label, "median_tpot_ms"] = tpot
    return parts[0].config, points, requests


def _write(run_dir: Path, config: dict, points: pd.DataFrame, requests: pd.DataFrame) -> None:
    (run_dir / "points").mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(config))
    for point in points.drop(columns=["run"]).to_dict("records"):
        (run_dir / "points" / f"{point['label']}.json").write_text(json.dumps(point))
    with open(run_dir / "requests.jsonl", "w") as f:
        for row in requests.drop(columns=["run"]).to_dict("records"):
            f.write(json.dumps(row) + "\n")


def test_subset_keeps_the_first_repeats_and_requests() -> None:
    config, points, requests = _repeated("r", 1, [1.0, 1.0, 1.0], 12)
    run = RunData("r", points, requests, config)
    part = subset(run, repeats=2, num_prompts=6)
    assert set(part.requests["repeat"]) == {0, 1} and part.requests["index"].max() == 5
    assert len(part.requests) == 2 * 2 * 6  # 2 loads x 2 repeats x 6 requests


def test_analysis_counts_false_alarms_and_detections(tmp_path: Path) -> None:
    """Two A/A trials with small drift and two with a 40 % TPOT slow-down: every variant with repeats passes the
    A/A trials and catches the slow-down; the table and the realised change say so."""
    study = GateStudyConfig(SweepConfig(tmp_path, num_prompts=24, repeats=3, values=[1, 2]),
                            aa_trials=2, detection_trials=2, regressions=(0.4,), thresholds=(0.10, 1.0))
    trials = []
    for k, (level, scale) in enumerate([(0.0, 1.0), (0.0, 1.0), (0.4, 1.4), (0.4, 1.4)]):
        tag = f"t{k}"
        _write(tmp_path / tag / "baseline", *_repeated("b", 10 * k, [1.0, 1.03, 0.98], 24))
        _write(tmp_path / tag / "candidate", *_repeated("c", 10 * k + 5, [scale, scale * 0.99, scale * 1.02], 24))
        trials.append({"regression": level, "trial": k, "delay_ms": 0.5 * level, "dir": tag, "wall_s": 150.0})
    (tmp_path / "trials.jsonl").write_text("".join(json.dumps(t) + "\n" for t in trials))
    summary = analyse(study, read_trials(tmp_path))
    rows = {row["variant"]: row for row in summary["variants"]}
    for name in ("R=3, n=24, >10%", "R=2, n=12, >10%"):
        assert rows[name]["fail_0"]["failed"] == 0 and rows[name]["fail_0.4"]["failed"] == 2
    assert rows["R=3, n=24, >10%"]["minutes_per_job"] == pytest.approx(150 / 60)  # all requests: the wall
    assert rows["R=3, n=24, >100%"]["fail_0.4"]["failed"] == 0  # within a 100 % threshold
    assert rows["R=3, n=12, >10%"]["minutes_per_job"] < rows["R=3, n=24, >10%"]["minutes_per_job"]
    assert summary["realised_tpot_p50_change"]["0.4"]["c0001"] == pytest.approx(0.4, abs=0.1)
    table = (tmp_path / "gate_study.md").read_text()
    assert "| R=3, n=24, >10% | 0/2 (0%; 0%-66%) | 2/2 (100%; 34%-100%) |" in table


def test_trials_run_as_compares_of_the_ref_against_itself(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from synthetic_runs import synthetic_run_dir

    from reports import gate_study

    seen = []

    def fake_compare(config: Any, console: Any = None) -> dict[str, Path]:
        seen.append(config)
        for target in config.targets:
            synthetic_run_dir(config.sweep.output_dir / target.name, seed=1, loads=[1, 2])
        return {t.name: config.sweep.output_dir / t.name for t in config.targets}

    monkeypatch.setattr(gate_study, "run_compare", fake_compare)
    study = GateStudyConfig(SweepConfig(tmp_path, num_prompts=12, repeats=1), ref="HEAD", aa_trials=1,
                            detection_trials=1, regressions=(0.5,))  # fmt: skip
    trials = gate_study.run_trials(study, log=lambda line: None)
    assert [t["dir"] for t in trials] == ["aa/t00", "slow50/t00"]
    aa, slow = seen
    assert aa.together and [(t.name, t.kind, t.value, t.knobs) for t in aa.targets] == [
        ("baseline", "ref", "HEAD", {}), ("candidate", "ref", "HEAD", {})]  # fmt: skip
    delay = slow.targets[1].knobs["inject_step_delay_ms"]
    assert delay == trials[1]["delay_ms"] > 0 and slow.sweep.output_dir == tmp_path / "slow50" / "t00"
