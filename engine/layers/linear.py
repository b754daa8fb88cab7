"""Linear layers shaped for tensor parallelism and quantization.

Each layer owns a `quant_method` (a `LinearMethodBase` from `engine.layers.quantization`) that creates its
parameters and performs the matmul, so a quantized method is a new linear method, not a new layer.
Column-parallel layers shard the output dimension and row-parallel layers the input dimension over the
tensor-parallel ranks; every parameter carries a `weight_loader` that copies the rank's shard of a
checkpoint tensor into place.

`tp_size`/`tp_rank` default to this process's tensor-parallel state (`engine.distributed`); passing them
builds one rank's shard in a single process, which is how the sharding math is unit-tested.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.distributed import (
    divide,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    split_kv_heads,
    tensor_model_parallel_all_reduce,
)
from engine.layers.quantization import LinearMethodBase, UnquantizedLinearMethod


def resolve_tp(tp_size: int | None, tp_rank: int | None) -> tuple[int, int]:
    """(tp_size, tp_rank), each defaulting to this process's tensor-parallel state."""
    size = get_tensor_model_parallel_world_size() if tp_size is None else tp_size
    rank = get_tensor_model_parallel_rank() if tp_rank is None else tp_rank
    if not 0 <= rank < size:
        raise ValueError(f"tp_rank must be in [0, tp_size), got tp_rank={rank}, tp_size={size}")
    return size, rank


def copy_checked(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst.copy_(src), refusing a checkpoint tensor of the wrong shape."""
    if dst.shape != src.shape:
        raise ValueError(f"checkpoint tensor has shape {tuple(src.shape)}, the layer expects {tuple(dst.shape)}")
    dst.copy_(src)


class LinearBase(nn.Module):
    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool,
        dtype: torch.dtype,
        tp_size: int | None = None,
        tp_rank: int | None = None,
        quant_method: LinearMethodBase | None = None,
    ) -> None:
        super().__init__()
        self.input_size, self.output_size = input_size, output_size  # local (per-rank) sizes
        self.tp_size, self.tp_rank = resolve_tp(tp_size, tp_rank)
        self.quant_method = quant_method or UnquantizedLinearMethod()
        self.quant_method.create_weights(self, input_size, output_size, dtype)
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size, dtype=dtype), requires_grad=False)
            self.bias.weight_loader = self.weight_loader  # type: ignore[attr-defined]
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        copy_checked(param.data, loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x, self.bias)


class ReplicatedLinear(LinearBase):
    """The full weight on every rank."""


class ColumnParallelLinear(LinearBase):
    """Y = X A with A split by columns (output features); each rank holds output_size / tp_size."""

    def __init__(
        self, input_size: int, output_size: int, bias: bool, dtype: torch.dtype, tp_size: int | None = None,
        tp_rank: int | None = None, quant_method: LinearMethodBase | None = None,
    ) -> None:  # fmt: skip
        tp_size, tp_rank = resolve_tp(tp_size, tp_rank)
        super().__init__(input_size, divide(output_size, tp_size), bias, dtype, tp_size, tp_rank, quant_method)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        shard = param.data.shape[0]
        copy_checked(param.data, loaded.narrow(0, self.tp_rank * shard, shard))


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of the same input stacked into one matmul (gate_up_proj)."""

    def __init__(
        self, input_size: int, output_sizes: list[int], bias: bool, dtype: torch.dtype, tp_size: int | None = None,
        tp_rank: int | None = None, quant_method: LinearMethodBase | None = None,
    ) -> None:  # fmt: skip
        self.output_sizes = output_sizes
        super().__init__(input_size, sum(output_sizes), bias, dtype, tp_size, tp_rank, quant_method)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(self.output_sizes):
            raise ValueError(
                f"a merged projection loads one shard index in [0, {len(self.output_sizes)}), got {shard_id!r}"
            )
        shard = divide(self.output_sizes[shard_id], self.tp_size)
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        copy_checked(param.data.narrow(0, offset, shard), loaded.narrow(0, self.tp_rank * shard, shard))


class QKVParallelLinear(ColumnParallelLinear):
    """Q, K and V projections in one matmul; heads are sharded over ranks.

    With more ranks than KV heads each rank holds one KV head, replicated on tp_size / total_num_kv_heads
    ranks. `num_heads` and `num_kv_heads` are the per-rank counts attention runs with.
    """

    def __init__(
        self, hidden_size: int, head_size: int, total_num_heads: int, total_num_kv_heads: int, bias: bool,
        dtype: torch.dtype, tp_size: int | None = None, tp_rank: int | None = None,
        quant_method: LinearMethodBase | None = None,
    ) -> None:  # fmt: skip
        tp_size, tp_rank = resolve_tp(tp_size, tp_rank)
        self.head_size = head_size
        self.num_heads = divide(total_num_heads, tp_size)
        self.num_kv_heads, self.num_kv_head_replicas = split_kv_heads(total_num_kv_heads, tp_size)
        output_size = (self.num_heads + 2 * self.num_kv_heads) * head_size * tp_size
        super().__init__(hidden_size, output_size, bias, dtype, tp_size, tp_rank, quant_method)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        q_size, kv_size = self.num_heads * self.head_size, self.num_kv_heads * self.head_size
        if shard_id == "q":
            offset, size, rank = 0, q_size, self.tp_rank
        elif shard_id == "k":
            offset, size, rank = q_size, kv_size, self.tp_rank // self.num_kv_head_replicas
        elif shard_id == "v":
            offset, size, rank = q_size + kv_size, kv_size, self.tp_rank // self.num_kv_head_replicas
        else:
            raise ValueError(f"QKV shard_id must be 'q', 'k' or 'v', got {shard_id!r}")
        copy_checked(param.data.narrow(0, offset, size), loaded.narrow(0, rank * size, size))


class RowParallelLinear(LinearBase):
    """Y = X A with A split by rows (input features); partial sums are all-reduced across ranks."""

    def __init__(
        self, input_size: int, output_size: int, bias: bool, dtype: torch.dtype, tp_size: int | None = None,
        tp_rank: int | None = None, quant_method: LinearMethodBase | None = None,
    ) -> None:  # fmt: skip
        tp_size, tp_rank = resolve_tp(tp_size, tp_rank)
        super().__init__(divide(input_size, tp_size), output_size, bias, dtype, tp_size, tp_rank, quant_method)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        if param.dim() == 1:  # the bias is added once, after the reduction
            copy_checked(param.data, loaded)
            return
        shard = param.data.shape[1]
        copy_checked(param.data, loaded.narrow(1, self.tp_rank * shard, shard))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self.quant_method.apply(self, x, self.bias)
        y = _all_reduce(self.quant_method.apply(self, x, None))
        return y if self.bias is None else y + self.bias


@torch.compiler.disable
def _all_reduce(x: torch.Tensor) -> torch.Tensor:
    """The ranks' sum; inside the compiled forward (engine/models/compilation.py) a graph break, run eagerly."""
    return tensor_model_parallel_all_reduce(x)
