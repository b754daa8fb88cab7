"""Linear layers shaped for tensor parallelism and quantization.

Each layer owns a `quant_method` that creates its parameters and performs the matmul, so a quantized
method (int8/int4/fp8) is a new `LinearMethodBase`, not a new layer. Column-parallel layers shard the
output dimension and row-parallel layers the input dimension over `tp_size` ranks; every parameter
carries a `weight_loader` that copies the rank's shard of a checkpoint tensor into place.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn


class LinearMethodBase(ABC):
    """How a linear layer stores its weight and computes x @ W^T (+ b). Stateless: state lives on the layer."""

    @abstractmethod
    def create_weights(self, layer: LinearBase, input_size: int, output_size: int, dtype: torch.dtype) -> None:
        """Register the layer's parameters for a local [output_size, input_size] weight."""

    def process_weights_after_loading(self, layer: LinearBase) -> None:
        """Convert the loaded checkpoint weights into the format `apply` uses (default: keep them)."""
        return None

    @abstractmethod
    def apply(self, layer: LinearBase, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor: ...


class UnquantizedLinearMethod(LinearMethodBase):
    def create_weights(self, layer: LinearBase, input_size: int, output_size: int, dtype: torch.dtype) -> None:
        weight = nn.Parameter(torch.empty(output_size, input_size, dtype=dtype), requires_grad=False)
        weight.weight_loader = layer.weight_loader  # type: ignore[attr-defined]
        layer.register_parameter("weight", weight)

    def apply(self, layer: LinearBase, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, layer.weight, bias)


def onednn_prepack(weight: torch.Tensor) -> torch.Tensor:
    """The weight reordered into oneDNN's blocked layout (CPU); pair with `onednn_linear`."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 32)


def onednn_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@lru_cache(maxsize=4)
def onednn_linear_available(dtype: torch.dtype) -> bool:
    """Whether this torch build runs prepacked oneDNN linears in `dtype` on the CPU, and agrees with F.linear."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(3, 64, generator=generator).to(dtype)
        w = torch.randn(48, 64, generator=generator).to(dtype)
        y = onednn_linear(x, onednn_prepack(w), None)
        return bool(torch.allclose(y.float(), F.linear(x, w).float(), atol=0.1, rtol=0.02))
    except (RuntimeError, AttributeError):  # an op missing or unsupported in this build
        return False


class OneDNNLinearMethod(UnquantizedLinearMethod):
    """Unquantized weights prepacked once for oneDNN (CPU).

    On AMD CPUs torch's default float32 GEMM (MKL) runs well below the AVX-512 peak, and it re-packs the
    weight on every call; a prepacked oneDNN linear is 2-3x faster at both decode (M ~ 32) and prefill
    (M ~ 2048) shapes. Results are float32-accurate but not bitwise equal to F.linear (another summation order).
    """

    def process_weights_after_loading(self, layer: LinearBase) -> None:
        layer.packed_weight = onednn_prepack(layer.weight)
        layer.weight.data = layer.weight.data.new_empty(0)  # the dense copy is no longer read

    def apply(self, layer: LinearBase, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return onednn_linear(x, layer.packed_weight, bias)


def default_linear_method(device: torch.device, dtype: torch.dtype) -> LinearMethodBase:
    if device.type == "cpu" and onednn_linear_available(dtype):
        return OneDNNLinearMethod()
    return UnquantizedLinearMethod()


def _divide(numerator: int, denominator: int) -> int:
    if numerator % denominator:
        raise ValueError(f"{numerator} is not divisible by tp_size={denominator}")
    return numerator // denominator


class LinearBase(nn.Module):
    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool,
        dtype: torch.dtype,
        tp_size: int = 1,
        tp_rank: int = 0,
        quant_method: LinearMethodBase | None = None,
    ) -> None:
        super().__init__()
        self.input_size, self.output_size = input_size, output_size  # local (per-rank) sizes
        self.tp_size, self.tp_rank = tp_size, tp_rank
        self.packed_weight: torch.Tensor | None = None  # set by methods that repack the weight after loading
        self.quant_method = quant_method or UnquantizedLinearMethod()
        self.quant_method.create_weights(self, input_size, output_size, dtype)
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size, dtype=dtype), requires_grad=False)
            self.bias.weight_loader = self.weight_loader  # type: ignore[attr-defined]
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        _copy_checked(param.data, loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x, self.bias)


def _copy_checked(dst: torch.Tensor, src: torch.Tensor) -> None:
    if dst.shape != src.shape:
        raise ValueError(f"checkpoint tensor has shape {tuple(src.shape)}, the layer expects {tuple(dst.shape)}")
    dst.copy_(src)


class ReplicatedLinear(LinearBase):
    """The full weight on every rank."""


class ColumnParallelLinear(LinearBase):
    """Y = X A with A split by columns (output features); each rank holds output_size / tp_size."""

    def __init__(
        self, input_size: int, output_size: int, bias: bool, dtype: torch.dtype, tp_size: int = 1, tp_rank: int = 0,
        quant_method: LinearMethodBase | None = None,
    ) -> None:  # fmt: skip
        super().__init__(input_size, _divide(output_size, tp_size), bias, dtype, tp_size, tp_rank, quant_method)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        shard = param.data.shape[0]
        _copy_checked(param.data, loaded.narrow(0, self.tp_rank * shard, shard))


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of the same input stacked into one matmul (gate_up_proj)."""

    def __init__(
        self, input_size: int, output_sizes: list[int], bias: bool, dtype: torch.dtype, tp_size: int = 1,
        tp_rank: int = 0, quant_method: LinearMethodBase | None = None,
    ) -> None:  # fmt: skip
        self.output_sizes = output_sizes
        super().__init__(input_size, sum(output_sizes), bias, dtype, tp_size, tp_rank, quant_method)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        assert isinstance(shard_id, int), "a merged projection loads one shard index at a time"
        shard = self.output_sizes[shard_id] // self.tp_size
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        _copy_checked(param.data.narrow(0, offset, shard), loaded.narrow(0, self.tp_rank * shard, shard))


class QKVParallelLinear(ColumnParallelLinear):
    """Q, K and V projections in one matmul; heads are sharded over ranks (KV heads replicated if fewer)."""

    def __init__(
        self, hidden_size: int, head_size: int, total_num_heads: int, total_num_kv_heads: int, bias: bool,
        dtype: torch.dtype, tp_size: int = 1, tp_rank: int = 0, quant_method: LinearMethodBase | None = None,
    ) -> None:  # fmt: skip
        self.head_size = head_size
        self.num_heads = _divide(total_num_heads, tp_size)
        self.num_kv_heads = max(1, total_num_kv_heads // tp_size)
        self.num_kv_head_replicas = max(1, tp_size // total_num_kv_heads)
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
        _copy_checked(param.data.narrow(0, offset, size), loaded.narrow(0, rank * size, size))


class RowParallelLinear(LinearBase):
    """Y = X A with A split by rows (input features); partial sums are all-reduced across ranks."""

    def __init__(
        self, input_size: int, output_size: int, bias: bool, dtype: torch.dtype, tp_size: int = 1, tp_rank: int = 0,
        quant_method: LinearMethodBase | None = None,
    ) -> None:  # fmt: skip
        super().__init__(_divide(input_size, tp_size), output_size, bias, dtype, tp_size, tp_rank, quant_method)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        if param.dim() == 1:  # the bias is added once, after the reduction
            _copy_checked(param.data, loaded)
            return
        shard = param.data.shape[1]
        _copy_checked(param.data, loaded.narrow(1, self.tp_rank * shard, shard))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self.quant_method.apply(self, x, self.bias)
        y = self.quant_method.apply(self, x, None)
        torch.distributed.all_reduce(y)
        return y if self.bias is None else y + self.bias
