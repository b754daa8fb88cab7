"""The Pareto of per-user speed against throughput: vLLM's definitions, per GPU when the parallelism is known."""

from __future__ import annotations

import pandas as pd
import pytest

from reports.importers import RunData
from reports.plots import pareto_points


def _run(mode: str, knobs: dict | None = None) -> RunData:
    points = pd.DataFrame({
        "label": ["c0001", "c0004", "c0016", "c0032"],
        "max_concurrency": [1, 4, 16, 32],
        "request_rate": [float("inf")] * 4,
        "output_throughput": [100.0, 360.0, 800.0, 780.0],  # the last point is slower and shares fewer tokens
        "request_throughput": [1.0, 3.0, 6.0, 6.0],
        "mean_e2el_ms": [1000.0, 1500.0, 2000.0, 4000.0],
    })
    config = {"sweep": {"mode": mode}, "target": {"engine_knobs": knobs or {}}}
    return RunData("run", points, pd.DataFrame(), config)


def test_concurrency_sweep_per_user_speed_and_the_front() -> None:
    frame = pareto_points(_run("concurrency"))
    assert frame["tokens_per_s_per_user"].tolist() == [100.0, 90.0, 50.0, pytest.approx(24.375)]
    assert frame["tokens_per_s"].tolist() == [100.0, 360.0, 800.0, 780.0]
    assert frame["on_frontier"].tolist() == [True, True, True, False]  # c0032: less of both than c0016


def test_throughput_is_per_gpu_when_the_parallelism_is_known() -> None:
    frame = pareto_points(_run("concurrency", {"tensor_parallel_size": 2, "data_parallel_size": 2}))
    assert frame["tokens_per_s"].tolist() == [25.0, 90.0, 200.0, 195.0]
    assert frame["tokens_per_s_per_user"].tolist()[:2] == [100.0, 90.0]  # a user's speed does not divide


def test_rate_sweep_counts_users_by_littles_law() -> None:
    frame = pareto_points(_run("rate"))
    # in flight = request_throughput x mean E2EL: 1, 4.5, 12, 24
    assert frame["tokens_per_s_per_user"].tolist() == [100.0, 80.0, pytest.approx(800 / 12), pytest.approx(32.5)]
