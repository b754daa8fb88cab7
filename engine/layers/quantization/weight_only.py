"""Weight-only int8 and int4 linear methods, and the int8 embedding table they pair with.

Both load the checkpoint's dense weight (so tensor-parallel shards and fused projections load as for `none`)
and quantize it in `process_weights_after_loading`; activations stay in the model's dtype at the layer
boundary.

On the CPU the matmuls are torch's packed kernels (`_weight_int8pack_mm`, `_weight_int4pack_mm_for_cpu`).
Their fast path reads bfloat16 activations: with float32 ones they are 5-50x slower than a dense float32
matmul, so activations are cast to bfloat16 for the kernel and the result cast back. Elsewhere int8 runs as a
dequantise-then-F.linear in torch ops; int4 is CPU-only (`for_device` refuses other devices).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ConfigError, quantization_unsupported_reason
from engine.layers.quantization.base import LinearMethodBase
from engine.layers.quantization.quant_utils import (
    INT4_GROUP_SIZES,
    pack_int4_for_cpu,
    quantize_int4_groupwise,
    quantize_int8_groupwise,
    quantize_int8_per_channel,
    split_int8_into_int4_pair,
)

_KERNEL_DTYPE = torch.bfloat16


def _create_dense_weight(layer: nn.Module, input_size: int, output_size: int, dtype: torch.dtype) -> None:
    weight = nn.Parameter(torch.empty(output_size, input_size, dtype=dtype), requires_grad=False)
    weight.weight_loader = layer.weight_loader  # type: ignore[attr-defined]
    layer.register_parameter("weight", weight)


def _drop_dense_weight(layer: nn.Module) -> None:
    # Rebinding frees the dense copy unless another module shares it (a tied embedding keeps its own).
    layer.weight = nn.Parameter(layer.weight.new_empty(0), requires_grad=False)


def _add_bias(y: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return y if bias is None else y + bias


class Int8LinearMethod(LinearMethodBase):
    """Weight-only int8: symmetric, one scale per output channel (`weight_int8` [N, K], `weight_scale` [N])."""

    def __init__(self, use_cpu_kernel: bool) -> None:
        self.use_cpu_kernel = use_cpu_kernel

    @classmethod
    def for_device(cls, device: torch.device, dtype: torch.dtype, group_size: int) -> Int8LinearMethod:
        return cls(use_cpu_kernel=device.type == "cpu")

    def create_weights(self, layer: nn.Module, input_size: int, output_size: int, dtype: torch.dtype) -> None:
        _create_dense_weight(layer, input_size, output_size, dtype)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        q, scale = quantize_int8_per_channel(layer.weight)
        layer.register_buffer("weight_int8", q, persistent=False)
        scale_dtype = _KERNEL_DTYPE if self.use_cpu_kernel else layer.weight.dtype
        layer.register_buffer("weight_scale", scale.to(scale_dtype), persistent=False)
        _drop_dense_weight(layer)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.use_cpu_kernel:
            y = torch.ops.aten._weight_int8pack_mm(x.to(_KERNEL_DTYPE), layer.weight_int8, layer.weight_scale)
            return _add_bias(y.to(x.dtype), bias)
        weight = layer.weight_int8.to(x.dtype) * layer.weight_scale[:, None].to(x.dtype)
        return F.linear(x, weight, bias)


class Int4LinearMethod(LinearMethodBase):
    """Weight-only int4, group-wise with scales and zero points, packed for torch's CPU int4 kernel.

    A layer holds `weight_int4pack` (uint8 [N, K/2]) and `weight_scales_and_zeros` (bfloat16 [K/g, N, 2]);
    `load_packed` takes already-quantized blocks (a GGUF's Q4_0/Q4_1 tensors) instead of a dense weight.
    """

    def __init__(self, group_size: int) -> None:
        if group_size not in INT4_GROUP_SIZES:
            raise ConfigError(f"quantization_group_size must be one of {INT4_GROUP_SIZES}, got {group_size}")
        self.group_size = group_size

    @classmethod
    def for_device(cls, device: torch.device, dtype: torch.dtype, group_size: int) -> Int4LinearMethod:
        if (reason := quantization_unsupported_reason("int4", device.type)) is not None:
            raise ConfigError(reason)
        return cls(group_size)

    def create_weights(self, layer: nn.Module, input_size: int, output_size: int, dtype: torch.dtype) -> None:
        if input_size % self.group_size or output_size % 16:
            raise ConfigError(
                f"quantization='int4' needs a layer's input size divisible by quantization_group_size "
                f"({self.group_size}) and its output size by 16; {type(layer).__name__} is "
                f"{output_size} x {input_size}: pick another --quantization-group-size or --quantization int8"
            )
        _create_dense_weight(layer, input_size, output_size, dtype)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if hasattr(layer, "weight_int4pack"):  # loaded already packed
            return
        q, scale, zero = quantize_int4_groupwise(layer.weight, self.group_size)
        self.load_packed(layer, q, scale, zero)

    def load_packed(self, layer: nn.Module, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> None:
        """Take the layer's weight as q [N, K] in 0..15, scale and zero [N, K/g], w = (q - 8) * scale + zero."""
        expected_groups = q.shape[1] // self.group_size
        if scale.shape != (q.shape[0], expected_groups) or zero.shape != scale.shape:
            raise ValueError(f"int4 scales of shape {tuple(scale.shape)} do not fit q {tuple(q.shape)}")
        packed, scales_and_zeros = pack_int4_for_cpu(q, scale, zero)
        layer.register_buffer("weight_int4pack", packed, persistent=False)
        layer.register_buffer("weight_scales_and_zeros", scales_and_zeros, persistent=False)
        _drop_dense_weight(layer)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.to(_KERNEL_DTYPE), layer.weight_int4pack, self.group_size, layer.weight_scales_and_zeros
        )
        return _add_bias(y.to(x.dtype), bias)


class Int8GroupedLinearMethod(LinearMethodBase):
    """Weight-only int8 with one scale per group of `group_size` inputs (CPU), for the LM head under int8.

    A per-channel int8 LM head costs SmolLM2-135M ~5 % top-1 agreement: its tied table is a GGUF Q8_0 tensor (one
    scale per 32 inputs), which one scale per row cannot hold. torch has no group-wise int8 kernel, so the int8
    weight is split into two int4 weights that sum to it exactly (`split_int8_into_int4_pair`) and runs as two
    packed int4 matmuls: the same bytes as int8.
    """

    def __init__(self, group_size: int) -> None:
        self.group_size = group_size

    def create_weights(self, layer: nn.Module, input_size: int, output_size: int, dtype: torch.dtype) -> None:
        _create_dense_weight(layer, input_size, output_size, dtype)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        rows, cols = layer.weight.shape
        if cols % self.group_size or rows % 16:
            raise ConfigError(
                f"the int8 LM head needs its input size divisible by quantization_group_size ({self.group_size}) "
                f"and its rows by 16, got {rows} x {cols}: pick another group size or --quantization-skip lm_head"
            )
        high, low = split_int8_into_int4_pair(*quantize_int8_groupwise(layer.weight, self.group_size))
        for name, part in (("high", high), ("low", low)):
            packed, scales_and_zeros = pack_int4_for_cpu(*part)
            layer.register_buffer(f"weight_int4pack_{name}", packed, persistent=False)
            layer.register_buffer(f"weight_scales_and_zeros_{name}", scales_and_zeros, persistent=False)
        _drop_dense_weight(layer)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        x16 = x.to(_KERNEL_DTYPE)
        mm = torch.ops.aten._weight_int4pack_mm_for_cpu
        y = mm(x16, layer.weight_int4pack_high, self.group_size, layer.weight_scales_and_zeros_high).to(x.dtype)
        y += mm(x16, layer.weight_int4pack_low, self.group_size, layer.weight_scales_and_zeros_low)
        return _add_bias(y, bias)


class Int8EmbeddingMethod:
    """An embedding table stored as int8 rows with one scale per row; a lookup dequantises only the rows it reads."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        q, scale = quantize_int8_per_channel(layer.weight)
        layer.register_buffer("weight_int8", q, persistent=False)
        layer.register_buffer("weight_scale", scale, persistent=False)
        layer.embedding_dtype = layer.weight.dtype
        _drop_dense_weight(layer)

    def embedding(self, layer: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        rows = F.embedding(ids, layer.weight_int8).to(layer.embedding_dtype)
        return rows * F.embedding(ids, layer.weight_scale[:, None]).to(layer.embedding_dtype)
