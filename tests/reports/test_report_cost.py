"""The report's cost: recomputed per point from the stored requests under the report's SLO, and plotted."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from matplotlib.figure import Figure

from reports.cost import COST_COLUMN, cost_vs_load, with_cost
from reports.importers import load_runs
from reports.recompute import with_slo
from sweep.run.cost import CostConfig


def test_with_cost_prices_each_point_from_its_good_requests(fixture_run: Path) -> None:
    (run,) = load_runs([fixture_run])
    priced = with_cost(run.points, run.requests, None, CostConfig(3.6))
    for _, point in priced.iterrows():
        rows = run.requests[(run.requests["label"] == point["label"]) & run.requests["success"].astype(bool)]
        tokens_per_s = rows["output_tokens"].sum() / point["duration"]
        assert point[COST_COLUMN] == pytest.approx(3.6 / (3600 * tokens_per_s) * 1e6)
        assert point["cost_source"] == "measured"
    strict = with_cost(run.points, run.requests, {"ttft_ms": 20.0}, CostConfig(3.6))
    assert (strict[COST_COLUMN].fillna(float("inf")) >= priced[COST_COLUMN]).all()  # fewer good tokens, dearer
    assert (strict[COST_COLUMN].fillna(float("inf")) > priced[COST_COLUMN]).any()


def test_stored_prices_are_kept_and_unpriced_runs_are_left_alone(fixture_run: Path) -> None:
    (run,) = load_runs([fixture_run])
    assert with_cost(run.points, run.requests, None, None) is run.points
    run.points = with_cost(run.points.assign(cost_per_hour=7.2), run.requests, None, None, simulated=True)
    assert set(run.points["cost_source"]) == {"simulated"}
    run.points = with_slo(run.points, run.requests, {"ttft_ms": 50.0})
    assert isinstance(cost_vs_load([run], {"ttft_ms": 50.0}), Figure)
    (unpriced,) = load_runs([fixture_run])
    assert cost_vs_load([unpriced], None) is None
    assert isinstance(run.points, pd.DataFrame)


def test_the_report_prices_the_devices_each_point_stored(fixture_run: Path) -> None:
    (run,) = load_runs([fixture_run])
    stored = run.points.assign(cost_per_hour=8.0, gpus_per_instance=8, devices_used=2)
    whole = with_cost(run.points.assign(cost_per_hour=8.0, gpus_per_instance=8), run.requests, None, None)
    shared = with_cost(stored, run.requests, None, None)
    assert set(shared["devices_used"]) == {2} and set(shared["configuration_cost_per_hour"]) == {2.0}
    assert list(shared[COST_COLUMN] * 4) == pytest.approx(list(whole[COST_COLUMN]))  # 2 of 8 GPUs, not 8 of 8
    repriced = with_cost(stored, run.requests, None, CostConfig(16.0, gpus_per_instance=8))
    assert set(repriced["configuration_cost_per_hour"]) == {4.0}  # the report's price, the stored devices
