"""The architecture hyper-parameters of a Llama-family checkpoint, parsed from an HF config.json dict."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.distributed import divide, split_kv_heads

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ArchConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool  # Qwen2: bias on q/k/v only
    o_proj_bias: bool  # Llama's attention_bias puts a bias on o_proj too
    mlp_bias: bool
    sliding_window: int | None
    torch_dtype: torch.dtype
    eos_token_ids: list[int]

    @property
    def max_model_len(self) -> int:
        """The longest context the engine serves exactly (a sliding window caps it: no windowed attention yet)."""
        if self.sliding_window is not None:
            return min(self.max_position_embeddings, self.sliding_window)
        return self.max_position_embeddings

    def get_num_attention_heads(self, tensor_parallel_size: int) -> int:
        """Query heads each tensor-parallel rank runs."""
        return divide(self.num_attention_heads, tensor_parallel_size)

    def get_num_kv_heads(self, tensor_parallel_size: int) -> int:
        """KV heads each rank holds in its KV cache (one, replicated, when there are more ranks than KV heads)."""
        return split_kv_heads(self.num_key_value_heads, tensor_parallel_size)[0]

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> ArchConfig:
        architectures = hf.get("architectures") or ["LlamaForCausalLM"]
        architecture = architectures[0]
        if architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"architecture {architecture} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        # transformers >= 5 writes rope settings as `rope_parameters`; older configs use rope_theta/rope_scaling.
        rope = dict(hf.get("rope_parameters") or {})
        rope_theta = float(rope.pop("rope_theta", hf.get("rope_theta", 10000.0)))
        rope_scaling = hf.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        num_heads = hf["num_attention_heads"]
        is_qwen2 = architecture == "Qwen2ForCausalLM"
        attention_bias = bool(hf.get("attention_bias", False))
        sliding_window = hf.get("sliding_window")
        if is_qwen2 and not hf.get("use_sliding_window", False):
            sliding_window = None
        eos = hf.get("eos_token_id")
        dtype_name = str(hf.get("torch_dtype") or hf.get("dtype") or "float32")
        return cls(
            architecture=architecture,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_hidden_layers=hf["num_hidden_layers"],
            num_attention_heads=num_heads,
            num_key_value_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // num_heads,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=True if is_qwen2 else attention_bias,
            o_proj_bias=False if is_qwen2 else attention_bias,
            mlp_bias=bool(hf.get("mlp_bias", False)),
            sliding_window=sliding_window,
            torch_dtype=_TORCH_DTYPES.get(dtype_name.removeprefix("torch."), torch.float32),
            eos_token_ids=[] if eos is None else ([eos] if isinstance(eos, int) else list(eos)),
        )
