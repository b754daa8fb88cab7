"""`bench ab`: both sides served at once, sweeps interleaved ABBA, then gated."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app
from reports.ab import Side, side_template

MOCK = f"{shlex.quote(sys.executable)} -m sweep.mock.server --port {{port}} --ttft-ms 5"
FLAGS = ["--model", "tiny-random", "--concurrency", "1,2", "--num-prompts", "12", "--repeats", "2",
         "--input-len", "16", "--output-len", "8", "--metric", "tpot_p50,failure_rate", "--noise-floor", "2%"]


def test_side_needs_exactly_one_source() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        Side("baseline")
    with pytest.raises(ValueError, match="exactly one"):
        Side("baseline", ref="HEAD", command="x")


def test_side_templates() -> None:
    command = side_template(Side("candidate", command="srv {model} --port {port}", extra_args="--delay {x}"), {}, None)
    assert command == "srv {model} --port {port} --delay '{{x}}'"
    ref = side_template(Side("baseline", ref="HEAD", extra_args="--inject-step-delay-ms 3"), {"max_num_seqs": 8},
                        Path("/tmp/wt"))
    argv = shlex.split(ref.format(model="tiny-random", host="127.0.0.1", port=8000))
    assert argv[:2] == ["env", "PYTHONPATH=/tmp/wt"] and argv[3:7] == ["-P", "-m", "cli", "serve"]
    assert argv[7:] == ["tiny-random", "--host", "127.0.0.1", "--port", "8000", "--max-num-seqs", "8",
                        "--inject-step-delay-ms", "3"]


def test_ab_interleaves_and_gates(tmp_path: Path) -> None:
    runner = CliRunner()
    same = runner.invoke(app, ["ab", "--baseline-command", f"{MOCK} --itl-ms 4", "--candidate-command",
                               f"{MOCK} --itl-ms 4", *FLAGS, "--output-dir", str(tmp_path / "aa")])
    assert same.exit_code == 0, same.output
    assert "PASS" in same.output and "Repeats: baseline 2, candidate 2" in same.output
    for side in ("baseline", "candidate"):
        run = tmp_path / "aa" / side
        assert sorted(p.name for p in (run / "repeats").iterdir()) == [
            "c0001.r0.json", "c0001.r1.json", "c0002.r0.json", "c0002.r1.json"
        ]
        assert json.loads((run / "points" / "c0002.json").read_text())["num_repeats"] == 2
        assert "speed" in json.loads((run / "config.json").read_text())["calibration"]
    slower = runner.invoke(app, ["ab", "--baseline-command", f"{MOCK} --itl-ms 4", "--candidate-command",
                                 f"{MOCK} --itl-ms 4", "--candidate-args", "--itl-ms 8", *FLAGS,
                                 "--output-dir", str(tmp_path / "ab")])
    assert slower.exit_code == 1, slower.output
    assert "regression" in slower.output


def test_ab_rejects_a_bad_ref(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["ab", "--baseline-ref", "no-such-ref-xyz", "--candidate-ref", "HEAD", *FLAGS,
                                      "--output-dir", str(tmp_path / "x")])
    assert result.exit_code == 2 and "no-such-ref-xyz" in result.output
