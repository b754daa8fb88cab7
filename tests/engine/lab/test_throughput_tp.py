"""`bench throughput-tp` (hidden alias, old code): the same requests at each tensor-parallel size, side by side,
with TP's per-step cost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from cli import app
from engine.benchmarks.throughput_run import ThroughputResult
from engine.lab.tensor_parallel import comparison_table, parse_sizes


def test_sizes_are_comma_separated_positive_ints() -> None:
    assert parse_sizes("1, 2,3") == [1, 2, 3]
    for bad in ("", "0,1", "one"):
        with pytest.raises(typer.BadParameter, match="comma-separated sizes >= 1"):
            parse_sizes(bad)


def test_table_gives_throughput_relative_to_the_first_size() -> None:
    one = ThroughputResult("engine", "m", "float32", 4, 2.0, 400, 100, 2.0, 200.0, 50.0)
    two = ThroughputResult("engine", "m", "float32", 4, 4.0, 400, 100, 1.0, 100.0, 25.0, tensor_parallel_size=2,
                           tp_step_payload_bytes=700.0, tp_logits_bytes=4096.0, tp_step_ms=12.5, tp_execute_ms=11.0,
                           tp_collective_ms=3.25)  # fmt: skip
    lines = comparison_table([one, two]).splitlines()
    assert lines[2] == "| 1 | 2.0 | 200.0 | 50.0 | 1.00× | — | — | — | — | — |"
    assert lines[3] == "| 2 | 4.0 | 100.0 | 25.0 | 0.50× | 12.5 | 11.0 | 3.2 | 700 | 4096 |"


def test_a_size_the_model_cannot_split_is_refused_before_any_run() -> None:
    result = CliRunner().invoke(app, ["throughput-tp", "--model", "smollm2-135m", "--tensor-parallel-size", "1,2"])
    assert result.exit_code == 1
    assert "tensor_parallel_size=2 does not split" in result.output and "valid sizes: 1, 3, 9" in result.output


@pytest.mark.slow  # two ranks start: ~10 s on 2 cores
def test_one_and_two_ranks_run_the_same_requests(tmp_path: Path) -> None:
    out = tmp_path / "tp.json"
    args = ["throughput-tp", "--model", "tiny-random", "--tensor-parallel-size", "1,2", "--num-prompts", "2"]
    args += ["--input-len", "8", "--output-len", "4", "--max-model-len", "64", "--output-json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    one, two = json.loads(out.read_text())
    assert (one["tensor_parallel_size"], two["tensor_parallel_size"]) == (1, 2)
    assert one["total_num_tokens"] == two["total_num_tokens"] == 24 and one["tp_step_ms"] is None
    assert two["tp_collective_ms"] > 0 and 0 < two["tp_step_payload_bytes"] < 1024 and two["tp_logits_bytes"] > 0
    assert "Tensor parallel: 2 ranks; per step" in result.output and "| 2 |" in result.output
