"""Fixtures for the tuner tests: a PostgreSQL server on loopback."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

POSTGRES_SH = Path(__file__).with_name("postgres.sh")


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """SERVELAB_TEST_POSTGRES_DSN (set by .ci/run), else a throwaway server started by postgres.sh."""
    if dsn := os.environ.get("SERVELAB_TEST_POSTGRES_DSN"):
        yield dsn
        return
    started = subprocess.run(["bash", str(POSTGRES_SH), "start"], capture_output=True, text=True, timeout=300)
    assert started.returncode == 0, f"could not start PostgreSQL:\n{started.stderr}"
    dsn, data_dir = started.stdout.split()
    try:
        yield dsn
    finally:
        subprocess.run(["bash", str(POSTGRES_SH), "stop", data_dir], capture_output=True, timeout=120)
