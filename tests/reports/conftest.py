"""Shared fixtures for the reports tests: the committed result files (synthetic runs: synthetic_runs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture
def fixture_run() -> Path:
    return FIXTURES / "sweep_a"


@pytest.fixture
def fixture_run_b() -> Path:
    return FIXTURES / "sweep_b"


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES
