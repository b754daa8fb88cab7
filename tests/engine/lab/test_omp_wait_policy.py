"""`bench lab omp-wait-policy`: its grid of runs (a fake runner), a real busy-client cell with a stub command, and the
table it prints."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app
from engine.lab import omp_wait_policy
from engine.lab.omp_wait_policy import ThreadsCell


def test_the_grid_runs_each_policy_alone_and_beside_a_client() -> None:
    calls = []

    def fake_run(command: list[str], policy: str, beside: bool, timeout_s: float, out: Path) -> ThreadsCell:
        calls.append((command[-1], policy, beside, timeout_s))
        return ThreadsCell(policy, beside, 10.0, False)

    cells = omp_wait_policy.run_grid(lambda out: ["x", str(out)], 5.0, lambda _: None, run=fake_run)
    assert [(c.omp_wait_policy, c.beside_client) for c in cells] == [
        ("ACTIVE", False), ("ACTIVE", True), ("PASSIVE", False), ("PASSIVE", True)
    ]  # fmt: skip
    assert len({out for out, *_ in calls}) == 4 and all(t == 5.0 for *_, t in calls)


def test_a_cell_reads_the_json_and_a_slow_run_counts_as_timed_out(tmp_path: Path) -> None:
    out = tmp_path / "cell.json"
    write = [sys.executable, "-c", f"import json, os; json.dump({{'output_tokens_per_second': 12.5, "
             f"'policy': os.environ['OMP_WAIT_POLICY']}}, open({str(out)!r}, 'w'))"]  # fmt: skip
    cell = omp_wait_policy.run_cell(write, "PASSIVE", True, 60.0, out)
    assert cell == ThreadsCell("PASSIVE", True, 12.5, False)
    slow = omp_wait_policy.run_cell([sys.executable, "-c", "import time; time.sleep(30)"], "ACTIVE", False, 0.5, out)
    assert slow.timed_out and slow.output_tokens_per_second == 0.0


def test_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    values = {("ACTIVE", False): 20.0, ("ACTIVE", True): 0.0, ("PASSIVE", False): 20.0, ("PASSIVE", True): 15.0}

    def fake_grid(command_for, timeout_s, progress):  # type: ignore[no-untyped-def]
        return [ThreadsCell(p, b, v, v == 0.0) for (p, b), v in values.items()]

    monkeypatch.setattr(omp_wait_policy, "run_grid", fake_grid)
    result = CliRunner().invoke(app, ["lab", "omp-wait-policy", "--timeout-s", "99"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[1].split() == ["ACTIVE", "20.0", "tok/s", ">", "99", "s", "0.00"]
    assert lines[2].split() == ["PASSIVE", "20.0", "tok/s", "15.0", "tok/s", "0.75"]
