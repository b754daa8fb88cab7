"""Paged attention on the CPU with a fused C++ decode kernel: the torch backend with its decode path replaced.

KV cache layout per layer, the torch backend's: [2, num_kv_heads, num_blocks, block_size, head_dim], contiguous,
float32, bfloat16 or float16 (kv_cache_dtype may differ from the model's dtype). The KV write is the torch
backend's (one index_copy_ per K and V, before attending), so the decode's own token is in the cache when read.

* Decodes (query length 1 with context) run as ONE call per layer to torch.ops.servelab_cpu.paged_decode_attention
  (engine/attention/ops/cpu_paged_attention.cpp): per (sequence, kv_head), in parallel over torch's threads, it
  walks the sequence's block table and reads each K and V row once for the kv head's query heads (GQA), with an
  online softmax, reading every dtype as float32 and accumulating in float32. No gather, no padding, no mirror.
  Invariants: each decode's block table covers seq_len tokens; padding entries past them are never read.
* Prefill chunks, prefix-cache hits and verification steps (several query tokens with context) stay on the torch
  backend's prefill path unchanged.
* Fallback: the kernel is built on first use (ops/cpu_paged_attention.py); when it cannot be built or loaded, a
  warning says why, once, and this backend is the torch backend throughout (`auto` then picks `torch`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention.ops.cpu_paged_attention import DecodeKernel, load_cpu_decode_kernel
from engine.attention.torch_backend import DecodeBatch, TorchAttentionBackend, TorchAttentionMetadata


@dataclass
class CpuAttentionMetadata(TorchAttentionMetadata):
    decode_rows: torch.Tensor | None = None  # [num_decodes] int32: the decodes' rows in the flat batch
    decode_block_tables: torch.Tensor | None = None  # [num_decodes, max_blocks] int32, padded with 0 (never read)
    decode_seq_lens: torch.Tensor | None = None  # [num_decodes] int32


class CpuAttentionBackend(TorchAttentionBackend):
    metadata_type = CpuAttentionMetadata

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, block_size: int) -> None:
        super().__init__(num_heads, num_kv_heads, head_dim, scale, block_size)
        self.kernel: DecodeKernel | None = load_cpu_decode_kernel()

    def _decode_metadata(self, metadata: TorchAttentionMetadata, decodes: DecodeBatch, device: torch.device) -> None:
        if self.kernel is None:
            return super()._decode_metadata(metadata, decodes, device)
        if device.type != "cpu":
            raise ValueError(f"the cpu attention backend runs on the CPU, not {device.type}")
        assert isinstance(metadata, CpuAttentionMetadata)
        width = max(len(t) for t in decodes.tables)
        metadata.num_decodes = len(decodes.rows)
        metadata.decode_rows = torch.tensor(decodes.rows, dtype=torch.int32)
        padded = [t + [0] * (width - len(t)) for t in decodes.tables]
        metadata.decode_block_tables = torch.tensor(padded, dtype=torch.int32)
        metadata.decode_seq_lens = torch.tensor(decodes.lens, dtype=torch.int32)

    def _decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        kv_cache: torch.Tensor | None,
        md: TorchAttentionMetadata,
    ) -> None:
        if self.kernel is None:
            return super()._decode(q, k, v, out, kv_cache, md)
        if kv_cache is None:
            raise ValueError("decode tokens need a KV cache")
        assert isinstance(md, CpuAttentionMetadata)
        self.kernel(out, q, kv_cache, md.decode_block_tables, md.decode_seq_lens, md.decode_rows, self.scale)
