"""Shared fixtures for the reports tests: committed result files and in-memory synthetic runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.insert(0, str(FIXTURES))

from make_synthetic_run import synthesize_run, write_run  # noqa: E402

from reports.importers import RunData  # noqa: E402


def synthetic_run(name: str, **kwargs) -> RunData:
    """A seeded synthetic run held in memory (the same generator as the committed fixture runs)."""
    config, points, requests = synthesize_run(**kwargs)
    points_df, requests_df = pd.DataFrame(points), pd.DataFrame(requests)
    points_df["run"] = name
    requests_df["run"] = name
    return RunData(name, points_df, requests_df, config)


def synthetic_run_dir(path: Path, **kwargs) -> Path:
    return write_run(path, *synthesize_run(**kwargs))


@pytest.fixture
def fixture_run() -> Path:
    return FIXTURES / "sweep_a"


@pytest.fixture
def fixture_run_b() -> Path:
    return FIXTURES / "sweep_b"


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES
