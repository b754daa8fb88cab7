"""`bench sweep --request-rate R --rate-curve CURVE`: arrivals follow the curve's shape at mean rate R."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import cli
from sweep.mock.calibrate import start_mock
from sweep.point.runner import PointSpec, send_offsets
from sweep.run.sweep_config import SweepConfig
from workloads.rate_curve import parse_rate_curve


def test_a_curve_is_numbers_or_a_shipped_mix_with_one() -> None:
    assert parse_rate_curve("1, 4,2") == [1.0, 4.0, 2.0]
    servegen = parse_rate_curve("servegen-deepseek-r1")
    assert len(servegen) == 144 and min(servegen) > 0  # one day of ten-minute windows
    for bad in ("1,x", "0,0", "-1,2", "1,inf"):
        with pytest.raises(ValueError, match="--rate-curve"):
            parse_rate_curve(bad)
    with pytest.raises(ValueError, match="has no rate curve.*servegen-deepseek-r1"):
        parse_rate_curve("azure-conv-2023")


def test_arrivals_follow_the_curve_at_the_points_mean_rate() -> None:
    n, rate = 2000, 10.0
    spec = PointSpec(label="r", mode="rate", rate=rate, num_prompts=n, rate_curve=(1.0, 3.0, 0.0, 4.0))
    offsets = np.array(send_offsets(spec, n, seed=3))
    span = n / rate  # no --duration: one pass of the curve over n / R seconds
    counts = np.histogram(offsets, bins=4, range=(0, span))[0]
    assert counts[2] == 0  # a zero-rate window gets nothing
    assert counts / n == pytest.approx([0.125, 0.375, 0.0, 0.5], abs=0.03)
    assert np.all(np.diff(offsets) >= 0) and offsets[-1] == pytest.approx(span, rel=0.05)
    timed = PointSpec(label="r", mode="rate", rate=rate, duration=20.0, rate_curve=(1.0, 3.0))
    spread = np.array(send_offsets(timed, timed.pool_size, seed=3))
    assert np.mean(spread < 10.0) == pytest.approx(0.25, abs=0.05)  # --duration: the curve spans the duration


def test_the_curve_goes_with_request_rates_only() -> None:
    with pytest.raises(ValueError, match="--rate-curve"):
        SweepConfig(output_dir=Path("x"), mode="concurrency", values=[2], rate_curve=[1.0, 2.0])
    with pytest.raises(ValueError, match="--rate-curve"):
        SweepConfig(output_dir=Path("x"), mode="rate", values=[4.0], ramp_up=("linear", 1.0, 4.0), rate_curve=[1, 2])
    with pytest.raises(ValueError, match="--rate-curve"):
        PointSpec(label="x", mode="rate", rate=1.0, num_prompts=2, rate_curve=(0.0,))


def test_the_command_takes_a_curve_and_saves_it(tmp_path: Path) -> None:
    runner = CliRunner()
    common = ["sweep", "--model", "mock", "--tokenizer", "tiny-random", "--no-report", "--no-calibration"]
    common += ["--no-server-metrics", "--workload", "fixed", "--input-len", "16", "--output-len", "2"]
    wrong = runner.invoke(cli.app, [*common, "--concurrency", "2", "--rate-curve", "1,2", "--url", "http://x/v1"])
    assert wrong.exit_code == 2 and "--rate-curve" in wrong.output
    bad = runner.invoke(cli.app, [*common, "--request-rate", "2", "--rate-curve", "1,a", "--url", "http://x/v1"])
    assert bad.exit_code == 2 and "--rate-curve takes comma-separated" in bad.output
    out = tmp_path / "run"
    with start_mock(1.0, 0.5, tmp_path / "mock.log") as mock:
        done = runner.invoke(
            cli.app,
            [*common, "--url", mock.url, "--request-rate", "40", "--rate-curve", "1,3", "--num-prompts", "12",
             "--output-dir", str(out)],
        )  # fmt: skip
    assert done.exit_code == 0, done.output
    config = json.loads((out / "config.json").read_text())
    assert config["sweep"]["rate_curve"] == [1.0, 3.0]
    point = json.loads((out / "points" / "r0040.00.json").read_text())
    assert point["completed"] == 12 and point["request_rate"] == 40.0
    assert point["rate_curve_windows"] == 2 and point["rate_curve_window_s"] == pytest.approx(0.15)
    assert point["rate_curve_peak_rps"] == pytest.approx(60.0)  # 3 / mean(1, 3) x 40
