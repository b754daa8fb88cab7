"""Build the native model for a checkpoint directory: pick the class, load the weights, prepare them.

Finding and converting checkpoints (aliases, GGUF, hub ids) is `engine.model_files`. The model is built for
this process's tensor-parallel rank (`engine.distributed`), and its linear layers, the LM head included,
get their method from the `quantization` knob (`engine.layers.quantization`). A quantized model also stores
its embedding table as int8 rows, and under int8 on the CPU its LM head is group-wise int8 (see
`Int8GroupedLinearMethod` for why); `skip` leaves `lm_head` and/or `embed_tokens` in the model's dtype.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from engine.layers.quantization import (
    Int8EmbeddingMethod,
    Int8GroupedLinearMethod,
    LinearMethodBase,
    UnquantizedLinearMethod,
    get_linear_method,
)
from engine.layers.quantization.quant_utils import tensor_bytes
from engine.model_files import iter_safetensors, load_hf_config, resolve_model
from engine.models import MODEL_REGISTRY, ArchConfig, LlamaForCausalLM

logger = logging.getLogger(__name__)


def load_model(
    name: str,
    dtype: torch.dtype,
    device: torch.device,
    max_position: int | None = None,
    quantization: str = "none",
    group_size: int = 32,
    skip: Iterable[str] = (),
    gguf: Path | None = None,
) -> tuple[LlamaForCausalLM, ArchConfig, Path]:
    """Build the native model for `name` on `device` in `dtype`, load its weights and prepare them.

    `max_position` bounds the rotary tables (default: the model's max_position_embeddings). `quantization`,
    `group_size` (int4) and `skip` (layer names left unquantized) are the quantization knobs; with int4 and
    `gguf` (the GGUF file `name` was converted from), Q4_0/Q4_1 tensors are repacked from their blocks. Returns
    the model in eval mode, its architecture and the resolved checkpoint directory.
    """
    path = resolve_model(name)
    arch = ArchConfig.from_hf(load_hf_config(path))
    linear_method = get_linear_method(quantization, device, dtype, group_size)
    with torch.device(device):
        model = MODEL_REGISTRY[arch.architecture](arch, dtype, max_position, linear_method)
    skipped = set(skip)
    if quantization != "none":
        unquantized = UnquantizedLinearMethod.for_device(device, dtype)
        # Every method loads the same dense weight, so swapping the LM head's before loading is safe.
        if "lm_head" in skipped:
            model.lm_head.quant_method = unquantized
        elif quantization == "int8" and device.type == "cpu":
            model.lm_head.quant_method = Int8GroupedLinearMethod(group_size)
        if "embed_tokens" not in skipped:
            model.embed_tokens.embedding_method = Int8EmbeddingMethod()
    model.load_weights(iter_safetensors(path))
    before = tensor_bytes(_weights(model))
    if quantization == "int4" and gguf is not None:
        from engine.layers.quantization.gguf_repack import repack_gguf_int4

        repacked = repack_gguf_int4(model, gguf)
        logger.info("int4: %d linear layers repacked from the GGUF's Q4 blocks of %s", len(repacked), gguf.name)
    process_weights_after_loading(model)
    if quantization != "none":
        logger.info(
            "quantized %s; weights %.1f MiB -> %.1f MiB",
            describe_quantized(model, quantization),
            before / 2**20,
            tensor_bytes(_weights(model)) / 2**20,
        )
    return model.eval(), arch, path


def process_weights_after_loading(model: nn.Module) -> None:
    """Let every layer's linear (or embedding) method convert its loaded weights into the format it reads."""
    for module in model.modules():
        quant_method = getattr(module, "quant_method", None)
        if isinstance(quant_method, LinearMethodBase):
            quant_method.process_weights_after_loading(module)
        embedding_method = getattr(module, "embedding_method", None)
        if embedding_method is not None:
            embedding_method.process_weights_after_loading(module)


def describe_quantized(model: nn.Module, quantization: str) -> str:
    """Which layers hold quantized weights, e.g. 'int4: 120 linear layers + lm_head; int8 rows: embed_tokens'."""
    linear = [
        name
        for name, module in model.named_modules()
        if isinstance(getattr(module, "quant_method", None), LinearMethodBase)
        and not isinstance(module.quant_method, UnquantizedLinearMethod)
    ]
    text = f"{quantization}: {len([n for n in linear if n != 'lm_head'])} linear layers"
    text += " + lm_head" if "lm_head" in linear else " (lm_head unquantized)"
    embedded = [n for n, m in model.named_modules() if getattr(m, "embedding_method", None) is not None]
    return text + (f"; int8 rows: {', '.join(embedded)}" if embedded else "; embed_tokens unquantized")


def _weights(model: nn.Module) -> list[torch.Tensor]:
    """Every parameter and buffer, plus the oneDNN-prepacked weights the `none` method keeps as attributes."""
    packed = [m.packed_weight for m in model.modules() if isinstance(getattr(m, "packed_weight", None), torch.Tensor)]
    return list(model.parameters()) + list(model.buffers()) + packed
