"""Linear methods keyed by the `quantization` knob (vLLM's name); `get_linear_method` builds one.

A quantization method is a `LinearMethodBase` (create the layer's weights, convert them after loading, run
the matmul) registered here under its knob value; layers and models do not change. Each registry entry is
called with (device, activation dtype, group size) and raises ConfigError where it cannot run.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.layers.quantization.base import LinearMethodBase
from engine.layers.quantization.unquantized import UnquantizedLinearMethod
from engine.layers.quantization.weight_only import (
    Int4LinearMethod,
    Int8EmbeddingMethod,
    Int8GroupedLinearMethod,
    Int8LinearMethod,
)


def _unquantized(device: torch.device, dtype: torch.dtype, group_size: int) -> LinearMethodBase:
    return UnquantizedLinearMethod.for_device(device, dtype)


QUANTIZATION_METHODS: dict[str, Callable[[torch.device, torch.dtype, int], LinearMethodBase]] = {
    "none": _unquantized,
    "int8": Int8LinearMethod.for_device,
    "int4": Int4LinearMethod.for_device,
}


def get_linear_method(
    quantization: str, device: torch.device, dtype: torch.dtype, group_size: int = 32
) -> LinearMethodBase:
    """The linear method for `quantization` on `device` with activations in `dtype` (int4: `group_size`)."""
    if quantization not in QUANTIZATION_METHODS:
        raise ValueError(f"unknown quantization {quantization!r}; available: {', '.join(QUANTIZATION_METHODS)}")
    return QUANTIZATION_METHODS[quantization](device, dtype, group_size)


__all__ = [
    "QUANTIZATION_METHODS",
    "Int4LinearMethod",
    "Int8EmbeddingMethod",
    "Int8GroupedLinearMethod",
    "Int8LinearMethod",
    "LinearMethodBase",
    "UnquantizedLinearMethod",
    "get_linear_method",
]
