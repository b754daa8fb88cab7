from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from tune_fakes import FakeBackend

from sweep.tune.objective import ObjectiveSpec
from sweep.tune.replay import efficiency, export_grid, grid_best, load_grid, trials_to_reach
from sweep.tune.space import DeviceInfo, build_space
from sweep.tune.study import TuneObjective, open_study, run_study, storage_url

DEVICE = DeviceInfo(device="cpu", model_max_len=2048, min_model_len=100)


@pytest.fixture
def grid(tmp_path: Path) -> dict:
    """A full grid measured by the live tuner (GridSampler) on a fake engine: 4 x 2 x 2 = 16 configurations."""
    path = tmp_path / "space.json"
    path.write_text('{"max_num_seqs": {"choices": [1, 2, 4, 8]}, "block_size": {"choices": [16, 32]},'
                    '"enable_prefix_caching": {"choices": [false, true]}, "max_num_batched_tokens": {"fixed": 512},'
                    '"enable_chunked_prefill": null, "max_model_len": null, "speculative_config": null}')
    space = build_space(DEVICE, path)
    spec = ObjectiveSpec(kind="goodput", load=16)
    study = open_study(storage_url(None, tmp_path), "grid", spec, seed=0, info={}, grid=space.grid())
    backend = FakeBackend(lambda k: k["max_num_seqs"] * (1.5 if k["enable_prefix_caching"] else 1.0),
                          cannot_start=lambda k: k["block_size"] == 32 and k["max_num_seqs"] == 8)
    run_study(study, TuneObjective(space, spec, backend, tmp_path), 16, None, show_progress=False)
    assert len(backend.launched) == 16 and len({json.dumps(k, sort_keys=True) for k in backend.launched}) == 16
    return export_grid(study)


def test_export_holds_every_combination_with_its_feasibility(grid: dict, tmp_path: Path) -> None:
    assert len(grid["trials"]) == 16 and grid["direction"] == "maximize"
    assert grid["space"]["max_num_seqs"] == [1, 2, 4, 8]
    infeasible = [e for e in grid["trials"] if not e["feasible"]]
    assert len(infeasible) == 2 and all(e["params"]["block_size"] == 32 for e in infeasible)
    assert grid_best(grid) == 12.0  # max_num_seqs 8, prefix caching on, block 16
    path = tmp_path / "grid.json"
    path.write_text(json.dumps(grid))
    assert load_grid(path) == json.loads(json.dumps(grid))


def test_replay_counts_trials_to_near_best(grid: dict) -> None:
    # a grid sampler visits each configuration once, so it must reach the best within the grid's size
    count = trials_to_reach(grid, optuna.samplers.GridSampler(grid["space"], seed=0), 0.0, budget=16)
    assert count is not None and 1 <= count <= 16
    results = efficiency(grid, seeds=4, tolerance=0.05, budget=64)
    for name in ("tpe", "random"):
        assert len(results[name]["counts"]) == 4
        assert results[name]["reached"] == 4  # 64 draws over 16 configurations find the best one


def test_replay_rejects_a_grid_without_a_feasible_point(grid: dict) -> None:
    for entry in grid["trials"]:
        entry["feasible"] = False
    with pytest.raises(ValueError, match="no feasible"):
        grid_best(grid)


def test_the_recorded_smollm2_grid_replays() -> None:
    path = Path(__file__).resolve().parents[2] / "fixtures" / "tune_grid_smollm2_cpu.json"
    grid = load_grid(path)
    assert len(grid["trials"]) == 32 and sum(e["feasible"] for e in grid["trials"]) == 20
    best = grid_best(grid)
    assert best == max(e["value"] for e in grid["trials"] if e["feasible"])
    count = trials_to_reach(grid, optuna.samplers.TPESampler(seed=0), 0.05, budget=200)
    assert count is not None
