"""Tensor-parallel state and collectives (`parallel_state`)."""

from engine.distributed.parallel_state import (
    GroupCoordinator,
    destroy_model_parallel,
    divide,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    get_tp_group,
    init_distributed_environment,
    initialize_model_parallel,
    pop_collective_seconds,
    split_kv_heads,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
    valid_tensor_parallel_sizes,
)

__all__ = [
    "GroupCoordinator",
    "destroy_model_parallel",
    "divide",
    "get_tensor_model_parallel_rank",
    "get_tensor_model_parallel_world_size",
    "get_tp_group",
    "init_distributed_environment",
    "initialize_model_parallel",
    "pop_collective_seconds",
    "split_kv_heads",
    "tensor_model_parallel_all_gather",
    "tensor_model_parallel_all_reduce",
    "valid_tensor_parallel_sizes",
]
