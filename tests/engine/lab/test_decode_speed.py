"""`bench decode-speed` (the hidden alias running its old code): settings parsing and one tiny run's JSON (speeds
are measured, never asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from cli import app
from engine.lab.decode_speed import parse_settings


def test_settings_parse_and_bad_ones_name_the_format() -> None:
    assert parse_settings("float32/none, bfloat16/int8") == [("float32", "none"), ("bfloat16", "int8")]
    with pytest.raises(typer.BadParameter, match="DTYPE/QUANTIZATION"):
        parse_settings("float32")


def test_a_run_writes_one_row_per_setting_with_ratios_to_the_first(tmp_path: Path) -> None:
    out = tmp_path / "decode.json"
    args = ["decode-speed", "--model", "tiny-random", "--settings", "float32/none,float32/int4"]
    options = ["--output-len", "3", "--repeats", "1", "--threads", "1", "--output-json", str(out)]
    result = CliRunner().invoke(app, [*args, *options])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())
    assert [(r["dtype"], r["quantization"]) for r in rows] == [("float32", "none"), ("float32", "int4")]
    assert rows[0]["ratio"] == 1.0
    assert rows[1]["ratio"] == pytest.approx(rows[1]["output_tokens_per_second"] / rows[0]["output_tokens_per_second"])


def test_an_impossible_setting_is_a_clear_error() -> None:
    result = CliRunner().invoke(app, ["decode-speed", "--model", "tiny-random", "--settings", "float32/fp8"])
    assert result.exit_code == 1 and "quantization must be one of" in result.output


def test_threads_are_restored_after_the_run() -> None:
    import torch

    before = torch.get_num_threads()
    threads = 1 if before > 1 else 2
    args = ["decode-speed", "--model", "tiny-random", "--settings", "float32/none", "--threads", str(threads)]
    result = CliRunner().invoke(app, [*args, "--output-len", "2", "--repeats", "1"])
    assert result.exit_code == 0, result.output
    assert torch.get_num_threads() == before
