"""`bench spec-decode` (hidden alias, old code): one run per K and concurrency over the same greedy requests,
compared with K = 0."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from cli import app


def test_runs_every_k_and_concurrency_side_by_side(tmp_path: Path) -> None:
    out = tmp_path / "points.json"
    args = ["spec-decode", "--model", "tiny-random", "--num-prompts", "2", "--output-len", "6",
            "--num-speculative-tokens", "0,2", "--concurrency", "1,2", "--max-model-len", "512", "--output-json",
            str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    points = json.loads(out.read_text())
    assert [(p["concurrency"], p["num_speculative_tokens"]) for p in points] == [(1, 0), (2, 0), (1, 2), (2, 2)]
    for point in points:
        assert point["num_requests"] == 2 and 0 < point["total_output_tokens"] <= 12
        assert point["speedup"] > 0
        if point["num_speculative_tokens"]:
            assert point["outputs_match"] is True and len(point["acceptance_rate_per_position"]) == 2
    assert "| 2 | 2 |" in result.output


def test_bad_options_are_clear_errors() -> None:
    result = CliRunner().invoke(app, ["spec-decode", "--num-speculative-tokens", "0,x"])
    assert result.exit_code == 2 and "comma-separated integers" in result.output
    refused = CliRunner().invoke(app, ["spec-decode", "--speculative-config", '{"method": "ngram"}'])
    assert refused.exit_code == 2 and "set per run" in refused.output
