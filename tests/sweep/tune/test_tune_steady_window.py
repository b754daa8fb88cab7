"""`bench tune --steady-window auto`: a trial's points are measured with the detected steady window, so the tuner
judges each configuration by the window's figures (the mock as the engine, through the tuner's launcher)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app
from sweep.tune.backend import EngineBackend, TrialWorkload

TEMPLATE = f"{shlex.quote(sys.executable)} -m sweep.mock.server --port {{port}} --ttft-ms 2 --itl-ms 1"


@pytest.mark.slow  # an engine start and a point through the tuner's launcher: ~15 s on a busy machine
def test_trial_points_carry_the_steady_window(tmp_path: Path) -> None:
    workload = TrialWorkload(model="mock", tokenizer="tiny-random", workload="fixed", input_len=8, output_len=8,
                             num_prompts=24, num_warmups=0, slo={"ttft_ms": 5000.0}, steady_window="auto")
    backend = EngineBackend(workload, launch_command=TEMPLATE, startup_timeout_s=60)
    with backend.launch({}, tmp_path / "trial") as measure_at:
        point = measure_at(0)(4)
    assert point["window"] in ("steady", "full")  # without a window asked for, the point has no `window`
    stored = json.loads((tmp_path / "trial" / "repeat0" / "config.json").read_text())
    assert stored["sweep"]["steady_window"] == "auto"


def test_a_bad_steady_window_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["tune", "--slo", "ttft=500", "--steady-window", "often",
                                      "--output-dir", str(tmp_path / "study")])
    assert result.exit_code == 2 and "--steady-window takes 'auto'" in result.output
    assert not (tmp_path / "study").exists()


def test_a_fixed_steady_window_reaches_every_trial_sweep() -> None:
    workload = TrialWorkload(model="mock", tokenizer="tiny-random", workload="fixed", input_len=8, output_len=8,
                             num_prompts=24, slo={"ttft_ms": 5000.0}, warmup_seconds=5.0, cooldown_seconds=2.0)
    config = workload.sweep_config(Path("trial"), "http://127.0.0.1/v1", {})
    assert (config.warmup_seconds, config.cooldown_seconds) == (5.0, 2.0)


@pytest.mark.parametrize("flags,message", [
    (["--warmup-seconds", "-1"], "--warmup-seconds and --cooldown-seconds must be >= 0"),
    (["--cooldown-seconds", "5", "--steady-window", "auto"], "--steady-window auto"),
])
def test_bad_steady_window_seconds_are_usage_errors(tmp_path: Path, flags: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["tune", "--slo", "ttft=500", "--model", "tiny-random", *flags,
                                      "--output-dir", str(tmp_path / "study")])
    assert result.exit_code == 2 and message in result.output, result.output
    assert not (tmp_path / "study").exists()
