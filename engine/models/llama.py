"""Llama-family decoder (Llama incl. llama3/linear RoPE scaling, Mistral, Qwen2 with QKV bias).

Tokens of all sequences in a step are flattened into one [num_tokens, hidden] batch; attention is the
only place sequences interact, and it goes through the attention backend with the step's metadata.
Every layer is sized for this process's tensor-parallel rank (`engine.distributed`): attention runs this
rank's heads, and the embedding and LM head hold this rank's vocabulary rows. Every linear layer, the LM
head included, computes through the `linear_method` it is given (`engine.layers.quantization`).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from engine.attention.backend import AttentionBackend, AttentionMetadata
from engine.layers.activation import SiluAndMul
from engine.layers.layernorm import RMSNorm
from engine.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from engine.layers.logits_processor import LogitsProcessor
from engine.layers.quantization import LinearMethodBase
from engine.layers.rotary_embedding import RotaryEmbedding, apply_rotary
from engine.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from engine.models.arch_config import ArchConfig


class LlamaAttention(nn.Module):
    def __init__(
        self, config: ArchConfig, rotary: RotaryEmbedding, dtype: torch.dtype, linear_method: LinearMethodBase | None
    ) -> None:
        super().__init__()
        self.head_dim = config.head_dim
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size, self.head_dim, config.num_attention_heads, config.num_key_value_heads,
            config.qkv_bias, dtype, quant_method=linear_method,
        )  # fmt: skip
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads  # this rank's
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.o_proj = RowParallelLinear(
            config.num_attention_heads * self.head_dim, config.hidden_size, config.o_proj_bias, dtype,
            quant_method=linear_method,
        )  # fmt: skip
        self.rotary_emb = rotary  # shared by all layers
        self.kv_cache: torch.Tensor | None = None  # bound by the model runner

    def qkv(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The projections before attention: rotated q [T, heads, head_dim], rotated k and v [T, kv_heads, head_dim]."""
        num_tokens = hidden.shape[0]
        qkv = self.qkv_proj(hidden)
        qk = qkv[:, : self.q_size + self.kv_size].view(num_tokens, self.num_heads + self.num_kv_heads, self.head_dim)
        q, k = apply_rotary(qk, cos, sin).split([self.num_heads, self.num_kv_heads], dim=1)
        v = qkv[:, self.q_size + self.kv_size :].view(num_tokens, self.num_kv_heads, self.head_dim)
        return q, k, v


class LlamaMLP(nn.Module):
    def __init__(self, config: ArchConfig, dtype: torch.dtype, linear_method: LinearMethodBase | None) -> None:
        super().__init__()
        size, hidden, bias = config.intermediate_size, config.hidden_size, config.mlp_bias
        self.gate_up_proj = MergedColumnParallelLinear(hidden, [size, size], bias, dtype, quant_method=linear_method)
        self.down_proj = RowParallelLinear(size, hidden, bias, dtype, quant_method=linear_method)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self, config: ArchConfig, rotary: RotaryEmbedding, dtype: torch.dtype, linear_method: LinearMethodBase | None
    ) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, rotary, dtype, linear_method)
        self.mlp = LlamaMLP(config, dtype, linear_method)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)

    def pre_attention(
        self, hidden: torch.Tensor, residual: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """Input norm (with the residual add), QKV projection and rotary: (q, k, v, residual)."""
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        q, k, v = self.self_attn.qkv(hidden, cos, sin)
        return q, k, v, residual

    def post_attention(self, attn_out: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Output projection, post-attention norm (with the residual add) and the MLP: (hidden, residual)."""
        hidden = self.self_attn.o_proj(attn_out.view(attn_out.shape[0], self.self_attn.q_size))
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        backend: AttentionBackend,
        metadata: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`cos`/`sin`: the step's rotary tables (RotaryEmbedding.cos_sin); attention runs in the backend."""
        q, k, v, residual = self.pre_attention(hidden, residual, cos, sin)
        out = backend.forward(q, k, v, self.self_attn.kv_cache, metadata)
        return self.post_attention(out, residual)


class LlamaForCausalLM(nn.Module):
    # checkpoint projection name -> (fused parameter owner, shard id)
    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(
        self,
        config: ArchConfig,
        dtype: torch.dtype,
        max_position: int | None = None,
        linear_method: LinearMethodBase | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.rotary = rotary = RotaryEmbedding(
            config.head_dim,
            max_position or config.max_position_embeddings,
            config.rope_theta,
            config.rope_scaling,
            dtype,
        )
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, dtype)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, rotary, dtype, linear_method) for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, dtype, quant_method=linear_method)
        if config.tie_word_embeddings:
            self.lm_head.tie_weights(self.embed_tokens)
        self.logits_processor = LogitsProcessor(config.vocab_size)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        backend: AttentionBackend,
        metadata: AttentionMetadata,
        output_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Final normed hidden states of the tokens `output_rows` (default: all); feed them to compute_logits."""
        hidden = self.embed_tokens(input_ids)
        residual = None
        cos, sin = self.rotary.cos_sin(positions)  # once per step: every layer rotates at the same positions
        for layer in self.layers:
            hidden, residual = layer(hidden, residual, cos, sin, backend, metadata)
        assert residual is not None
        if output_rows is not None:
            hidden, residual = hidden.index_select(0, output_rows), residual.index_select(0, output_rows)
        hidden, _ = self.norm(hidden, residual)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[num_tokens, vocab_size] logits of the hidden states `forward` returned."""
        return self.logits_processor(self.lm_head, hidden)

    def bind_kv_caches(self, kv_caches: list[torch.Tensor] | None) -> None:
        for i, layer in enumerate(self.layers):
            layer.self_attn.kv_cache = None if kv_caches is None else kv_caches[i]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named checkpoint tensors into place; fails if any parameter stays unloaded."""
        params = dict(self.named_parameters(remove_duplicate=False))
        loaded: set[str] = set()
        for hf_name, tensor in weights:
            name = hf_name.removeprefix("model.")
            if "rotary_emb.inv_freq" in name:
                continue
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue
            shard_id: str | int | None = None
            for checkpoint_name, (fused_name, fused_shard) in self.packed_modules_mapping.items():
                if f".{checkpoint_name}." in name:
                    name, shard_id = name.replace(checkpoint_name, fused_name), fused_shard
                    break
            if name not in params:
                raise ValueError(f"unexpected checkpoint tensor {hf_name!r}")
            param = params[name]
            loader = getattr(param, "weight_loader", None)
            if loader is None:
                if param.shape != tensor.shape:
                    raise ValueError(f"{hf_name}: shape {tuple(tensor.shape)}, expected {tuple(param.shape)}")
                param.data.copy_(tensor)
            else:
                loader(param, tensor, shard_id)
            loaded.add(f"{name}:{shard_id}")
        expected = {f"{n}:{s}" for n, s in self._expected_shards()}
        missing = sorted(expected - loaded)
        if missing:
            raise ValueError(f"checkpoint is missing {len(missing)} tensor(s), e.g. {missing[:3]}")

    def _expected_shards(self) -> Iterable[tuple[str, str | int | None]]:
        for name, _ in self.named_parameters():
            if name.endswith("qkv_proj.weight") or name.endswith("qkv_proj.bias"):
                yield from ((name, s) for s in ("q", "k", "v"))
            elif name.endswith("gate_up_proj.weight") or name.endswith("gate_up_proj.bias"):
                yield from ((name, s) for s in (0, 1))
            else:
                yield name, None
