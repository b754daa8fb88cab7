"""The process's tensor-parallel state: its rank, the group's world size and the torch.distributed group.

A process that never calls `initialize_model_parallel` is rank 0 of a world of size 1, and every collective
below returns its input unchanged. With N > 1 ranks, each process first joins the torch.distributed world
(`init_distributed_environment`), then `initialize_model_parallel(N)` makes the whole world one
tensor-parallel group (there is no pipeline parallelism).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class GroupCoordinator:
    """One process's view of its parallel group."""

    rank_in_group: int
    world_size: int
    device_group: dist.ProcessGroup | None  # None for a world of size 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The elementwise sum of `x` over the group (in place)."""
        if self.world_size == 1:
            return x
        start = time.perf_counter()
        dist.all_reduce(x, group=self.device_group)
        _COLLECTIVE_SECONDS[0] += time.perf_counter() - start
        return x

    def barrier(self) -> None:
        """Wait until every rank of the group gets here."""
        if self.world_size > 1:
            dist.barrier(group=self.device_group)

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's `x` concatenated along `dim`, in rank order."""
        if self.world_size == 1:
            return x
        start = time.perf_counter()
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x.contiguous(), group=self.device_group)
        _COLLECTIVE_SECONDS[0] += time.perf_counter() - start
        return torch.cat(parts, dim=dim)


# Seconds this process has spent in all-reduce / all-gather calls (gloo: the whole exchange, waiting for the
# slowest rank included; NCCL: only the launch, the collective itself runs asynchronously on the stream).
_COLLECTIVE_SECONDS = [0.0]


def pop_collective_seconds() -> float:
    """The seconds spent in collectives since the last call."""
    seconds, _COLLECTIVE_SECONDS[0] = _COLLECTIVE_SECONDS[0], 0.0
    return seconds


_SINGLE_PROCESS = GroupCoordinator(rank_in_group=0, world_size=1, device_group=None)
_TP: GroupCoordinator = _SINGLE_PROCESS


def init_distributed_environment(
    world_size: int, rank: int, distributed_init_method: str = "env://", backend: str = "gloo"
) -> None:
    """Join the torch.distributed world of `world_size` processes as `rank` (a world of 1 needs no group)."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size), got rank={rank}, world_size={world_size}")
    if world_size == 1 or dist.is_initialized():
        return
    dist.init_process_group(backend, init_method=distributed_init_method, world_size=world_size, rank=rank)


def initialize_model_parallel(tensor_model_parallel_size: int = 1) -> None:
    """Make this process's tensor-parallel group: all `tensor_model_parallel_size` processes of the world."""
    global _TP
    if tensor_model_parallel_size == 1:
        _TP = _SINGLE_PROCESS
        return
    if not dist.is_initialized():
        raise RuntimeError(
            f"tensor_parallel_size={tensor_model_parallel_size} needs torch.distributed: "
            "call init_distributed_environment first"
        )
    if dist.get_world_size() != tensor_model_parallel_size:
        raise ValueError(
            f"tensor_parallel_size={tensor_model_parallel_size} must equal the torch.distributed world size "
            f"({dist.get_world_size()}): there is no pipeline parallelism"
        )
    _TP = GroupCoordinator(dist.get_rank(), tensor_model_parallel_size, dist.group.WORLD)


def destroy_model_parallel() -> None:
    """Back to a world of size 1; leaves the torch.distributed process group if this process joined one."""
    global _TP
    _TP = _SINGLE_PROCESS
    if dist.is_initialized():
        dist.destroy_process_group()


def get_tp_group() -> GroupCoordinator:
    return _TP


def get_tensor_model_parallel_rank() -> int:
    return _TP.rank_in_group


def get_tensor_model_parallel_world_size() -> int:
    return _TP.world_size


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    return _TP.all_reduce(x)


def tensor_model_parallel_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return _TP.all_gather(x, dim)


def divide(numerator: int, denominator: int) -> int:
    """numerator / denominator, which must divide exactly (a size split over ranks)."""
    if numerator % denominator:
        raise ValueError(f"{numerator} is not divisible by the tensor-parallel size {denominator}")
    return numerator // denominator


def split_kv_heads(total_num_kv_heads: int, tp_size: int) -> tuple[int, int]:
    """(KV heads per rank, ranks holding each KV head): KV heads are sharded, or replicated when scarcer than ranks."""
    if tp_size >= total_num_kv_heads:
        return 1, divide(tp_size, total_num_kv_heads)
    return divide(total_num_kv_heads, tp_size), 1


def valid_tensor_parallel_sizes(num_attention_heads: int, num_kv_heads: int) -> list[int]:
    """The sizes that divide the attention heads and either divide the KV heads or are a multiple of them."""
    return [
        size
        for size in range(1, num_attention_heads + 1)
        if num_attention_heads % size == 0 and (num_kv_heads % size == 0 or size % num_kv_heads == 0)
    ]
