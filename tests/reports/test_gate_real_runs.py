"""The example workflow's `bench compare --gate` on real servers of this commit: A/A passes, an injected 40 % TPOT
slow-down fails (the defaults' measured rates are in docs/GATE.md)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from reports.gate_study import typical_median_tpot_ms

ROOT = Path(__file__).resolve().parents[2]


def _ab(out: Path, candidate_knobs: str = "") -> subprocess.CompletedProcess:
    flags = shlex.split(yaml.safe_load((ROOT / "docs" / "gate-github-actions.yml").read_text())["env"]["AB_FLAGS"])
    command = [sys.executable, str(ROOT / "cli.py"), "compare", "--target", "baseline=ref:HEAD",
               "--target", f"candidate=ref:HEAD{candidate_knobs}", *flags, "--gate", "--output-dir", str(out)]
    return subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT)


@pytest.mark.slow
@pytest.mark.serial  # A/A must pass at the workflow's 10 % threshold
def test_workflow_gate_passes_identical_code_and_fails_a_40_percent_slowdown(tmp_path: Path) -> None:
    # These flags' measured A/A false-alarm rate is about 5 % (docs/GATE.md), so one failed A/A gets a second try;
    # two in a row (about 0.25 %) fail the test.
    aa_dir = tmp_path / "aa"
    same = _ab(aa_dir)
    if same.returncode == 1:
        aa_dir = tmp_path / "aa-again"
        same = _ab(aa_dir)
    assert same.returncode == 0, same.stdout[-3000:] + same.stderr[-3000:]
    delay_ms = 0.4 * typical_median_tpot_ms([aa_dir / "baseline"])
    slower = _ab(tmp_path / "slow", f":inject_step_delay_ms={delay_ms:.3f}")
    assert slower.returncode == 1, slower.stdout[-3000:] + slower.stderr[-3000:]
    assert "tpot_p50" in slower.stdout and "❌ regression" in slower.stdout
