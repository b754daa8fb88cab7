"""`bench lab tune-launches`: engines launched to reach near-best, hand-computed on two five-trial studies."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial
from typer.testing import CliRunner

from sweep.tune.replay import compare_launches, launched, open_single_study

T0 = dt.datetime(2026, 12, 2, 5, 0, 0)
DIST = {"x": CategoricalDistribution([1, 2, 3, 4, 5])}


def _trial(x: int, kind: str, value: float = 0.0, at: float = 0.0) -> optuna.trial.FrozenTrial:
    """ok (measured), constraint (refused before launch), start (launched, did not start), sim (pruned)."""
    attrs = {"ok": {"status": "ok"}, "constraint": {"status": "infeasible", "cause": "constraint"},
             "start": {"status": "infeasible", "cause": "start"}, "sim": {"status": "pruned by simulation"}}[kind]
    if kind == "sim":
        t = create_trial(state=TrialState.PRUNED, params={"x": x}, distributions=DIST, user_attrs=attrs,
                         constraints={"starts": -1.0})
    else:
        t = create_trial(value=value, params={"x": x}, distributions=DIST, user_attrs=attrs,
                         constraints={"starts": -1.0 if kind == "ok" else 1.0})
    t.datetime_start, t.datetime_complete = T0 + dt.timedelta(seconds=at), T0 + dt.timedelta(seconds=at + 10)
    return t


def _study(storage: str | None, trials: list[optuna.trial.FrozenTrial]) -> optuna.Study:
    study = optuna.create_study(storage=storage, study_name="s", direction="maximize")
    for t in trials:
        study.add_trial(t)
    return study


FULL = [_trial(1, "ok", 10, 0), _trial(2, "constraint", at=10), _trial(3, "ok", 19.5, 20), _trial(4, "ok", 20, 40),
        _trial(5, "start", at=90)]  # best 20 (x=4), target 19 (5 %); launched: 1, 3, 4, 5
SIMFIRST = [_trial(1, "sim", at=0), _trial(2, "constraint", at=1), _trial(3, "ok", 18.5, 2),
            _trial(4, "ok", 22, 20), _trial(5, "sim", at=30)]  # x=3 measured below target here (noise), x=4 above


def test_launches_to_near_best_hand_computed() -> None:
    assert [launched(t) for t in SIMFIRST] == [False, False, True, True, False]
    r = compare_launches(_study(None, FULL), {"simfirst": _study(None, SIMFIRST)}, tolerance=0.05)
    assert r["best"] == 20 and r["best_params"] == {"x": 4} and r["target"] == pytest.approx(19.0)
    full, sf = r["studies"]["full"], r["studies"]["simfirst"]
    counts = ("trials", "launched", "pruned_by_simulation", "refused_before_launch")
    assert [full[k] for k in counts] == [5, 4, 0, 1]
    # x=1 (10) is launch 1, x=3 (19.5 >= 19) launch 2
    assert (full["launches_to_target"], full["trial_reaching_target"], full["launches_to_target_config"]) == (2, 2, 2)
    assert full["best"] == 20 and full["wall_s"] == 100
    assert [sf[k] for k in counts] == [5, 2, 2, 1]
    # x=3 measured 18.5 (< 19) at launch 1, x=4 measured 22 at launch 2; by the full grid's values x=3 (19.5) counts
    assert (sf["launches_to_target"], sf["trial_reaching_target"], sf["launches_to_target_config"]) == (2, 3, 1)
    assert sf["best"] == 22 and sf["wall_s"] == 40
    assert r["same_order"] == {"full": True, "simfirst": True}
    pairs = r["same_configuration"]["simfirst"]
    assert [(p["params"]["x"], p["full"], p["simfirst"]) for p in pairs] == [(3, 19.5, 18.5), (4, 20, 22)]
    assert pairs[0]["relative"] == pytest.approx(-1 / 19.5) and pairs[1]["relative"] == pytest.approx(0.1)
    # an even count of pairs: the median is the mean of the middle two, not the upper one
    spread = r["same_configuration_spread"]["simfirst"]
    assert spread == {"pairs": 2, "median": pytest.approx((1 / 19.5 + 0.1) / 2), "max": pytest.approx(0.1)}


def test_never_reaching_the_target_is_none() -> None:
    r = compare_launches(_study(None, FULL), {"sf": _study(None, [_trial(1, "ok", 10), _trial(4, "sim")])})
    assert r["studies"]["sf"]["launches_to_target"] is None and r["studies"]["sf"]["launches_to_target_config"] is None
    assert r["same_order"]["sf"] is False


def test_the_command_reads_two_tune_directories(tmp_path: Path) -> None:
    from cli import app

    for name, trials in (("full", FULL), ("sf", SIMFIRST)):
        (tmp_path / name).mkdir()
        _study(f"sqlite:///{tmp_path / name / 'tune.db'}", trials)
    out = tmp_path / "launches.json"
    result = CliRunner().invoke(app, ["lab", "tune-launches", str(tmp_path / "full"), f"simfirst={tmp_path / 'sf'}",
                                      "--output-json", str(out)], env={"COLUMNS": "240"})
    assert result.exit_code == 0, result.output
    assert "target 19" in result.output
    assert "2 pairs, |difference| median 7.6%, max 10.0%" in result.output  # (5.1 % + 10 %) / 2
    saved = json.loads(out.read_text())
    assert saved["studies"]["simfirst"]["launches_to_target"] == 2 and saved["studies"]["full"]["launched"] == 4
    bad = CliRunner().invoke(app, ["lab", "tune-launches", str(tmp_path / "full"), str(tmp_path / "sf")])
    assert bad.exit_code == 2 and "NAME=DIR" in bad.output
    with pytest.raises(ValueError, match="no tune.db"):
        open_single_study(str(tmp_path / "nowhere"))


def test_a_grid_with_and_without_simulate_first_visits_the_same_order(tmp_path: Path) -> None:
    """The comparison's premise: GridSampler with one seed draws the same order when trials are pruned."""
    from tune_fakes import FakeBackend

    from sweep.tune.objective import ObjectiveSpec
    from sweep.tune.simulate_first import SimulateFirstObjective
    from sweep.tune.space import DeviceInfo, build_space
    from sweep.tune.study import TuneObjective, open_study, run_study, storage_url

    path = tmp_path / "space.json"
    path.write_text('{"max_num_seqs": {"choices": [1, 2, 4, 8]}, "max_num_batched_tokens": {"choices": [256, 2048]},'
                    '"enable_chunked_prefill": {"choices": [true, false]}, "max_model_len": 1024, "block_size": null,'
                    '"enable_prefix_caching": null, "speculative_config": null}')
    space = build_space(DeviceInfo(device="cpu", model_max_len=2048, min_model_len=100), path)
    spec = ObjectiveSpec(kind="goodput", load=8)
    studies, backends = {}, {}
    for name in ("full", "sf"):
        out = tmp_path / name
        out.mkdir()
        backends[name] = real = FakeBackend(lambda k: float(k["max_num_seqs"]))
        study = open_study(storage_url(None, out), "grid", spec, seed=0, info={}, grid=space.grid())
        objective = (TuneObjective(space, spec, real, out) if name == "full" else
                     SimulateFirstObjective(space, spec, real, out, margin=0.2,
                                            simulator=FakeBackend(lambda k: float(k["max_num_seqs"]))))
        run_study(study, objective, 16, None, show_progress=False)
        studies[name] = study
    r = compare_launches(studies["full"], {"sf": studies["sf"]})
    assert r["same_order"]["sf"] and r["best"] == 8.0
    full, sf = r["studies"]["full"], r["studies"]["sf"]
    assert full["refused_before_launch"] == sf["refused_before_launch"] == 4  # chunked prefill off with 256
    assert full["launched"] == 12 == len(backends["full"].launched)
    assert sf["launched"] == len(backends["sf"].launched) == 12 - sf["pruned_by_simulation"]
    assert sf["launches_to_target"] <= full["launches_to_target"]  # an exact simulator never prunes the best
