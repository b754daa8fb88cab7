"""`bench lab decode-profile`: one tiny run's JSON has every part of the step per token (times never asserted)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from cli import app


def test_a_run_splits_the_step_into_its_parts(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    args = ["lab", "decode-profile", "--model", "tiny-random", "--settings", "int4", "--input-len", "8",
            "--output-len", "4", "--threads", "1", "--no-llama-cpp", "--output-json", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    record = json.loads(out.read_text())["ours/int4"]
    assert set(record["parts_ms"]) == {"schedule", "execute_model", "sampler", "update_from_output",
                                       "rest of EngineCore.step", "output processing + detokenizer"}
    assert record["parts_ms"]["execute_model"] > 0 and record["top_operators_ms_per_token"]
    assert "ms/token" in result.output
