"""Gated activations on a fused gate_up projection."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    """silu(gate) * up for x = [gate | up] along the last dimension (SwiGLU)."""

    fused_kernel: Callable[[torch.Tensor], torch.Tensor] | None = None  # see engine.layers.triton_fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused_kernel is not None:
            return self.fused_kernel(x)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate).mul_(up)
