"""The attention backend interface: metadata built once per step, then one call per layer.

A step is a flat batch of T tokens from several sequences. Sequence i contributes `query_lens[i]`
consecutive tokens (a prefill chunk, or 1 token for a decode) and, counting them, has `seq_lens[i]`
tokens of context; its KV lives in the blocks `block_tables[i]` of the paged cache. Token t's new K/V
is written to flat slot `slot_mapping[t]` (block_id * block_size + offset); slot -1 means "don't write".
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    num_tokens: int
    slot_mapping: torch.Tensor  # [num_tokens] int64


class AttentionBackend(ABC):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, block_size: int) -> None:
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale, self.block_size = scale, block_size

    def kv_cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        """Shape of one layer's KV cache tensor (K and V together): [2, kv_heads, blocks, block_size, head_dim].
        Every backend reads and writes this one layout."""
        return (2, self.num_kv_heads, num_blocks, self.block_size, self.head_dim)

    @abstractmethod
    def build_metadata(
        self,
        query_lens: list[int],
        seq_lens: list[int],
        block_tables: list[list[int]],
        slot_mapping: torch.Tensor,
        device: torch.device,
    ) -> AttentionMetadata: ...

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor | None,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """q: [T, num_heads, head_dim], k/v: [T, num_kv_heads, head_dim] -> [T, num_heads, head_dim].

        Writes k/v into `kv_cache` first (skipped when it is None: the profiling run before the cache
        exists, which must then contain only fresh prefills).
        """
