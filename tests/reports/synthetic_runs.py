"""Seeded synthetic runs for the reports tests (the same generator as the committed fixture runs).

A module of its own, not conftest.py: `from conftest import ...` resolves to whichever conftest pytest loaded last,
which breaks when other test directories with a conftest.py are collected in the same session.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.insert(0, str(FIXTURES))

from make_synthetic_run import synthesize_run, write_run  # noqa: E402

from reports.importers import RunData  # noqa: E402


def synthetic_run(name: str, **kwargs) -> RunData:
    """A seeded synthetic run held in memory."""
    config, points, requests = synthesize_run(**kwargs)
    points_df, requests_df = pd.DataFrame(points), pd.DataFrame(requests)
    points_df["run"] = name
    requests_df["run"] = name
    return RunData(name, points_df, requests_df, config)


def synthetic_run_dir(path: Path, **kwargs) -> Path:
    return write_run(path, *synthesize_run(**kwargs))
