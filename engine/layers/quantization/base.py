"""The interface every linear method implements: how a layer stores its weight and computes x @ W^T (+ b)."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import nn


class LinearMethodBase(ABC):
    """Creates a linear layer's weight parameters, converts them after loading, and runs the matmul.

    Stateless: the weights live on the layer. Layers that use a method: `LinearBase` subclasses and
    `ParallelLMHead`; each gives its parameters a `weight_loader` before the method registers them.
    """

    @abstractmethod
    def create_weights(self, layer: nn.Module, input_size: int, output_size: int, dtype: torch.dtype) -> None:
        """Register the layer's parameters for a local (per-rank) [output_size, input_size] weight."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Convert the loaded checkpoint weights into the format `apply` uses (default: keep them)."""
        return None

    @abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x @ W^T (+ bias) for the layer's local weight."""
