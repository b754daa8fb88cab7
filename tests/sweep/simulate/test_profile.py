"""bench model profile: hand-built steps have the intended shapes; a tiny profile fits and records what it measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.executor.cost_model import CostModel, StepShape
from sweep.simulate.profile import GridPoint, build_step, default_grid, profile_model


def test_a_grid_step_has_the_shape_it_names() -> None:
    point = GridPoint(prefill_tokens=8, prefill_context=16, decode_seqs=3, decode_context=20)
    output = build_step(point, vocab_size=50, block_size=4)
    shape = StepShape.of(output)
    assert (shape.num_prefill_tokens, shape.num_prefill_seqs) == (8, 1)
    assert (shape.num_decode_seqs, shape.decode_context_tokens) == (3, 3 * 21)
    assert output.total_num_scheduled_tokens == 11
    assert all(s.block_ids == list(range(len(s.block_ids))) for s in output.scheduled)  # one shared table
    assert [len(s.block_ids) for s in output.scheduled] == [6, 6, 6, 6]
    assert point.longest == 24


def test_default_grid_covers_prefill_decode_and_mixed_steps() -> None:
    grid = default_grid([16, 64], [1, 8], [128, 512])
    assert GridPoint(prefill_tokens=64, prefill_context=512) in grid
    assert GridPoint(decode_seqs=8, decode_context=128) in grid
    assert GridPoint(prefill_tokens=16, decode_seqs=8, decode_context=512) in grid
    assert len(grid) == 2 + 2 + 4 + 2


def test_profile_of_the_tiny_model_fits_its_measurements() -> None:
    grid = [GridPoint(prefill_tokens=16), GridPoint(decode_seqs=2, decode_context=8), GridPoint(prefill_tokens=4)]
    data = profile_model({"model": "tiny-random", "max_model_len": 64}, grid, repeats=1, echo=lambda _: None)
    assert data["knobs"]["model"] == "tiny-random" and data["knobs"]["dtype"] == "float32"
    assert data["kv_cache"]["tokens"] > 0 and data["kv_cache"]["bytes_per_token"] > 0
    assert [m["grid"]["prefill_tokens"] for m in data["measurements"]] == [16, 0, 4]
    assert all(m["seconds"] > 0 for m in data["measurements"])
    model = CostModel.from_dict(json.loads(json.dumps(data["cost_model"])))
    assert {"mean_rel_error", "max_rel_error"} <= set(model.fit_error)
    with pytest.raises(ValueError, match="longer than max_model_len=64"):
        profile_model({"model": "tiny-random", "max_model_len": 64}, [GridPoint(decode_seqs=1, decode_context=64)], 1)


def test_profile_command_rejects_a_bad_grid(tmp_path: Path) -> None:
    from cli import app

    result = CliRunner().invoke(app, ["model", "profile", "--model", "tiny-random", "--decode-seqs", "0,4",
                                      "--output", str(tmp_path / "p.json")])  # fmt: skip
    assert result.exit_code != 0 and "positive integers" in result.output
    assert not (tmp_path / "p.json").exists()
