"""The tensor-parallel state of a process that never joined a group: rank 0 of 1, identity collectives."""

from __future__ import annotations

import pytest
import torch

from engine.distributed import (
    divide,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    get_tp_group,
    init_distributed_environment,
    initialize_model_parallel,
    split_kv_heads,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)


def test_a_single_process_is_rank_0_of_a_world_of_1() -> None:
    assert (get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()) == (0, 1)
    assert get_tp_group().device_group is None


def test_single_process_collectives_return_their_input() -> None:
    x = torch.randn(3, 5)
    expected = x.clone()
    assert tensor_model_parallel_all_reduce(x) is x
    assert tensor_model_parallel_all_gather(x, dim=-1) is x
    assert torch.equal(x, expected)


def test_initialize_model_parallel_of_1_needs_no_process_group() -> None:
    init_distributed_environment(world_size=1, rank=0)
    initialize_model_parallel(1)
    assert not torch.distributed.is_initialized()
    assert get_tensor_model_parallel_world_size() == 1


def test_more_ranks_without_a_process_group_is_refused() -> None:
    with pytest.raises(RuntimeError, match="init_distributed_environment first"):
        initialize_model_parallel(2)
    assert get_tensor_model_parallel_world_size() == 1


def test_rank_outside_the_world_is_refused() -> None:
    with pytest.raises(ValueError, match="rank must be in"):
        init_distributed_environment(world_size=2, rank=2)


def test_divide_refuses_an_uneven_split() -> None:
    assert divide(12, 4) == 3
    with pytest.raises(ValueError, match="9 is not divisible by the tensor-parallel size 2"):
        divide(9, 2)


def test_kv_heads_split_evenly_or_not_at_all() -> None:
    assert split_kv_heads(8, 1) == (8, 1)
    assert split_kv_heads(8, 2) == (4, 1)
    assert split_kv_heads(2, 4) == (1, 2)
    with pytest.raises(ValueError, match="not divisible"):
        split_kv_heads(3, 2)
    with pytest.raises(ValueError, match="not divisible"):
        split_kv_heads(3, 4)
