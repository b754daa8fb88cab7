"""The `none` quantization method: dense weights in the model's dtype."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.onednn import onednn_linear, onednn_linear_available, onednn_prepack
from engine.layers.quantization.base import LinearMethodBase


class UnquantizedLinearMethod(LinearMethodBase):
    """A dense [output, input] weight; with `prepack_onednn` it is prepacked once for oneDNN after loading.

    `for_device` prepacks on the CPU whenever this torch build supports it in the dtype (see
    `engine.layers.onednn` for why); elsewhere the matmul is F.linear.
    """

    def __init__(self, prepack_onednn: bool = False) -> None:
        self.prepack_onednn = prepack_onednn

    @classmethod
    def for_device(cls, device: torch.device, dtype: torch.dtype) -> UnquantizedLinearMethod:
        return cls(prepack_onednn=device.type == "cpu" and onednn_linear_available(dtype))

    def create_weights(self, layer: nn.Module, input_size: int, output_size: int, dtype: torch.dtype) -> None:
        weight = nn.Parameter(torch.empty(output_size, input_size, dtype=dtype), requires_grad=False)
        weight.weight_loader = layer.weight_loader  # type: ignore[attr-defined]
        layer.register_parameter("weight", weight)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if not self.prepack_onednn:
            return
        layer.packed_weight = onednn_prepack(layer.weight)
        # Rebinding (not `weight.data = ...`) frees the dense copy unless another module shares the
        # parameter: an LM head tied to the embedding leaves the embedding its dense weight.
        layer.weight = nn.Parameter(layer.weight.new_empty(0), requires_grad=False)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.prepack_onednn:
            return onednn_linear(x, layer.packed_weight, bias)
        return F.linear(x, layer.weight, bias)
