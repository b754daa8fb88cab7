"""Build the native model for a checkpoint directory: pick the class, load the weights, prepare them.

Finding and converting checkpoints (aliases, GGUF, hub ids) is `engine.model_files`. The model is built for
this process's tensor-parallel rank (`engine.distributed`), and its linear layers, the LM head included,
get their method from the `quantization` knob (`engine.layers.quantization`).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from engine.layers.quantization import LinearMethodBase, get_linear_method
from engine.model_files import iter_safetensors, load_hf_config, resolve_model
from engine.models import MODEL_REGISTRY, ArchConfig, LlamaForCausalLM


def load_model(
    name: str,
    dtype: torch.dtype,
    device: torch.device,
    max_position: int | None = None,
    quantization: str = "none",
) -> tuple[LlamaForCausalLM, ArchConfig, Path]:
    """Build the native model for `name` on `device` in `dtype`, load its weights and prepare them.

    `max_position` bounds the rotary tables (default: the model's max_position_embeddings). Returns the model
    in eval mode, its architecture and the resolved checkpoint directory.
    """
    path = resolve_model(name)
    arch = ArchConfig.from_hf(load_hf_config(path))
    linear_method = get_linear_method(quantization, device, dtype)
    with torch.device(device):
        model = MODEL_REGISTRY[arch.architecture](arch, dtype, max_position, linear_method)
    model.load_weights(iter_safetensors(path))
    process_weights_after_loading(model)
    return model.eval(), arch, path


def process_weights_after_loading(model: nn.Module) -> None:
    """Let every layer's linear method convert its loaded weights into the format its matmul reads."""
    for module in model.modules():
        quant_method = getattr(module, "quant_method", None)
        if isinstance(quant_method, LinearMethodBase):
            quant_method.process_weights_after_loading(module)
