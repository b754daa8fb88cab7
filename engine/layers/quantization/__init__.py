"""Linear methods keyed by the `quantization` knob (vLLM's name); `get_linear_method` builds one.

A quantization method is a `LinearMethodBase` (create the layer's weights, convert them after loading, run
the matmul) registered here under its knob value; layers and models do not change.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.layers.quantization.base import LinearMethodBase
from engine.layers.quantization.unquantized import UnquantizedLinearMethod

QUANTIZATION_METHODS: dict[str, Callable[[torch.device, torch.dtype], LinearMethodBase]] = {
    "none": UnquantizedLinearMethod.for_device,
}


def get_linear_method(quantization: str, device: torch.device, dtype: torch.dtype) -> LinearMethodBase:
    """The linear method for `quantization` on `device` with activations in `dtype`."""
    if quantization not in QUANTIZATION_METHODS:
        raise ValueError(f"unknown quantization {quantization!r}; available: {', '.join(QUANTIZATION_METHODS)}")
    return QUANTIZATION_METHODS[quantization](device, dtype)


__all__ = ["QUANTIZATION_METHODS", "LinearMethodBase", "UnquantizedLinearMethod", "get_linear_method"]
