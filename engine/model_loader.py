"""Build the native model for a checkpoint directory: pick the class, load the weights, prepare them.

Finding and converting checkpoints (aliases, GGUF, hub ids) is `engine.model_files`.
"""

from __future__ import annotations

from pathlib import Path

import torch

from engine.layers.linear import default_linear_method
from engine.model_files import iter_safetensors, load_hf_config, resolve_model
from engine.models import MODEL_REGISTRY, ArchConfig, LlamaForCausalLM


def load_model(
    name: str, dtype: torch.dtype, device: torch.device, max_position: int | None = None
) -> tuple[LlamaForCausalLM, ArchConfig, Path]:
    """Build the native model for `name` on `device` in `dtype`, load its weights and prepare them.

    `max_position` bounds the rotary tables (default: the model's max_position_embeddings).
    """
    path = resolve_model(name)
    arch = ArchConfig.from_hf(load_hf_config(path))
    with torch.device(device):
        model = MODEL_REGISTRY[arch.architecture](arch, dtype, max_position, default_linear_method(device, dtype))
    model.load_weights(iter_safetensors(path))
    model.process_weights_after_loading()
    return model.eval(), arch, path
