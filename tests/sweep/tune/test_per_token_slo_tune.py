"""`bench tune` takes the per-token SLOs (`itl_p99`, `max_stall`): parsed before any trial, measured per point."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from cli import app
from sweep.simulate.simulation import load_profile
from sweep.tune.backend import TrialWorkload
from sweep.tune.simulate_first import SimulatedBackend


def test_tune_parses_the_per_token_keys_before_any_trial(tmp_path: Path) -> None:
    base = ["tune", "--model", "tiny-random", "--output-dir", str(tmp_path / "out")]
    result = CliRunner().invoke(app, [*base, "--slo", "itl_p95=50"])
    assert result.exit_code == 2 and "bad SLO item 'itl_p95=50'" in result.output
    # accepted: the run stops at the next check (a cost objective without a price), still before any trial
    result = CliRunner().invoke(app, [*base, "--slo", "max_stall=200,itl_p99=100", "--objective", "cost"])
    assert result.exit_code == 2 and "needs --cost-per-hour" in result.output, result.output
    assert not (tmp_path / "out" / "tune.db").exists()


def test_a_trial_point_is_judged_by_the_stall(tmp_path: Path) -> None:
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({
        "kind": "servelab-step-profile", "knobs": {"model": "tiny-random"}, "kv_cache": {"tokens": 4096},
        "cost_model": {"coefficients": {"overhead": 0.01, "tokens": 0.001}},
    }))  # fmt: skip
    attained = {}
    for limit in (0.0, 10_000.0):  # every decode step takes > 0 ms; none takes 10 s
        workload = TrialWorkload(model="tiny-random", input_len=16, output_len=4, num_prompts=4,
                                 slo={"max_stall_ms": limit})  # fmt: skip
        with SimulatedBackend(load_profile(profile), workload).launch({"max_num_seqs": 2, "max_model_len": 128},
                                                                      tmp_path / f"t{limit:g}") as for_repeat:
            point = for_repeat(0)(2)
        assert point["completed"] == 4 and point["p99_max_stall_ms"] > 0
        attained[limit] = point["slo_attainment"]
    assert attained == {0.0: 0.0, 10_000.0: 1.0}
