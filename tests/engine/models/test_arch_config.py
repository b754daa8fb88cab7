"""ArchConfig: per-rank head counts for tensor parallelism."""

from __future__ import annotations

import pytest

from engine.model_files import TINY_RANDOM_CONFIG
from engine.models import ArchConfig


def test_world_size_1_runs_every_head() -> None:
    arch = ArchConfig.from_hf(dict(TINY_RANDOM_CONFIG, num_attention_heads=8, num_key_value_heads=2))
    assert (arch.get_num_attention_heads(1), arch.get_num_kv_heads(1)) == (8, 2)


def test_heads_split_over_ranks_and_kv_heads_replicate_when_scarcer() -> None:
    arch = ArchConfig.from_hf(dict(TINY_RANDOM_CONFIG, num_attention_heads=8, num_key_value_heads=2))
    assert (arch.get_num_attention_heads(2), arch.get_num_kv_heads(2)) == (4, 1)
    assert (arch.get_num_attention_heads(4), arch.get_num_kv_heads(4)) == (2, 1)


def test_heads_that_do_not_split_evenly_are_refused() -> None:
    arch = ArchConfig.from_hf(dict(TINY_RANDOM_CONFIG, num_attention_heads=9, num_key_value_heads=3))
    with pytest.raises(ValueError, match="9 is not divisible by the tensor-parallel size 2"):
        arch.get_num_attention_heads(2)
    with pytest.raises(ValueError, match="3 is not divisible by the tensor-parallel size 2"):
        arch.get_num_kv_heads(2)
