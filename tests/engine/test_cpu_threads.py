"""`bench` makes OpenMP threads wait passively unless the environment says otherwise, before torch loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cpu_threads import set_default_omp_wait_policy

ROOT = Path(__file__).resolve().parents[2]


def test_the_default_is_passive_and_a_set_policy_wins() -> None:
    environ: dict[str, str] = {}
    assert set_default_omp_wait_policy(environ) == "PASSIVE" and environ == {"OMP_WAIT_POLICY": "PASSIVE"}
    environ = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert set_default_omp_wait_policy(environ) == "ACTIVE" and environ == {"OMP_WAIT_POLICY": "ACTIVE"}


@pytest.mark.parametrize(("preset", "expected"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_importing_the_cli_sets_it_before_torch_is_loaded(preset: str | None, expected: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if preset:
        env["OMP_WAIT_POLICY"] = preset
    code = "import os, sys, cli; print(os.environ['OMP_WAIT_POLICY'], 'torch' in sys.modules)"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [expected, "False"]  # torch (and its OpenMP runtime) not loaded yet
