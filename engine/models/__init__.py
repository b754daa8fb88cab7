"""Native model implementations, chosen by the checkpoint's `architectures` entry."""

from __future__ import annotations

from engine.models.arch_config import SUPPORTED_ARCHITECTURES, ArchConfig
from engine.models.llama import LlamaForCausalLM

# Mistral and Qwen2 are Llama with config flags (sliding window cap, QKV bias).
MODEL_REGISTRY: dict[str, type[LlamaForCausalLM]] = {name: LlamaForCausalLM for name in SUPPORTED_ARCHITECTURES}

__all__ = ["MODEL_REGISTRY", "ArchConfig", "LlamaForCausalLM"]
