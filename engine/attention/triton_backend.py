"""Paged attention through Triton kernels (engine/attention/ops): the default backend on CUDA.

The KV cache layout is the torch backend's, [2, num_kv_heads, num_blocks, block_size, head_dim]. Per layer:
one kernel writes the step's new K/V (slot -1 skipped), one split-K kernel (plus its merge when a decode
spans several partitions) attends every decode (query length 1) over its blocks, and one kernel attends
every prefill chunk over its cached context and its own tokens, causally. Verification steps (several
query tokens with context) are prefill chunks. Metadata is built once per step as int32 tensors.

On the CPU the kernels run only under TRITON_INTERPRET=1 (slowly: the tests use it to check the kernels and
the engine against the torch backend); `--attention-backend auto` picks this backend on CUDA only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention.backend import AttentionBackend, AttentionMetadata
from engine.attention.ops.triton_kv_cache import write_kv_cache
from engine.attention.ops.triton_paged_attention import BLOCK_N, paged_decode_attention, paged_prefill_attention


@dataclass
class TritonAttentionMetadata(AttentionMetadata):
    num_decodes: int
    decode_token_indices: torch.Tensor  # [num_decodes] int32: the decodes' rows in the flat batch
    decode_block_tables: torch.Tensor  # [num_decodes, max_blocks] int32, padded with block 0 (never read)
    decode_seq_lens: torch.Tensor  # [num_decodes] int32
    max_decode_seq_len: int
    num_prefills: int
    prefill_query_start: torch.Tensor  # [num_prefills] int32: first row of each chunk
    prefill_query_lens: torch.Tensor  # [num_prefills] int32
    prefill_seq_lens: torch.Tensor  # [num_prefills] int32: context + chunk
    prefill_block_tables: torch.Tensor  # [num_prefills, max_blocks] int32
    max_prefill_query_len: int


def _padded_tables(tables: list[list[int]], device: torch.device) -> torch.Tensor:
    width = max((len(t) for t in tables), default=0) or 1
    return torch.tensor([t + [0] * (width - len(t)) for t in tables] or [[0]], dtype=torch.int32, device=device)


class TritonAttentionBackend(AttentionBackend):
    # Split-K length of a decode: one partition up to this many tokens (a multiple of BLOCK_N).
    decode_partition_size = 512

    def build_metadata(
        self,
        query_lens: list[int],
        seq_lens: list[int],
        block_tables: list[list[int]],
        slot_mapping: torch.Tensor,
        device: torch.device,
    ) -> TritonAttentionMetadata:
        if self.decode_partition_size % BLOCK_N:
            raise ValueError(f"decode_partition_size must be a multiple of {BLOCK_N}")
        decode_rows: list[int] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        prefill_starts: list[int] = []
        prefill_query_lens: list[int] = []
        prefill_lens: list[int] = []
        prefill_tables: list[list[int]] = []
        start = 0
        for query_len, seq_len, table in zip(query_lens, seq_lens, block_tables, strict=True):
            num_blocks = -(-seq_len // self.block_size)
            if len(table) < num_blocks:
                raise ValueError(f"a sequence of {seq_len} tokens needs {num_blocks} blocks, got {len(table)}")
            if query_len == 1 and seq_len > 1:
                decode_rows.append(start)
                decode_tables.append(table[:num_blocks])
                decode_lens.append(seq_len)
            else:
                prefill_starts.append(start)
                prefill_query_lens.append(query_len)
                prefill_lens.append(seq_len)
                prefill_tables.append(table[:num_blocks])
            start += query_len

        def ints(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int32, device=device)

        return TritonAttentionMetadata(
            num_tokens=start,
            slot_mapping=slot_mapping,
            num_decodes=len(decode_rows),
            decode_token_indices=ints(decode_rows),
            decode_block_tables=_padded_tables(decode_tables, device),
            decode_seq_lens=ints(decode_lens),
            max_decode_seq_len=max(decode_lens, default=0),
            num_prefills=len(prefill_starts),
            prefill_query_start=ints(prefill_starts),
            prefill_query_lens=ints(prefill_query_lens),
            prefill_seq_lens=ints(prefill_lens),
            prefill_block_tables=_padded_tables(prefill_tables, device),
            max_prefill_query_len=max(prefill_query_lens, default=0),
        )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor | None,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        assert isinstance(metadata, TritonAttentionMetadata)
        md = metadata
        if kv_cache is not None:
            write_kv_cache(k, v, kv_cache, md.slot_mapping)
        elif md.num_decodes or bool((md.prefill_seq_lens != md.prefill_query_lens).any()):
            raise ValueError("decodes and prefill chunks with cached context need a KV cache")
        out = torch.empty_like(q)
        if md.num_decodes:
            assert kv_cache is not None
            paged_decode_attention(
                q, kv_cache, md.decode_block_tables, md.decode_seq_lens, md.decode_token_indices, out,
                self.scale, md.max_decode_seq_len, self.decode_partition_size,
            )  # fmt: skip
        if md.num_prefills:
            paged_prefill_attention(
                q, k, v, kv_cache, md.prefill_block_tables, md.prefill_query_start, md.prefill_query_lens,
                md.prefill_seq_lens, out, self.scale, md.max_prefill_query_len, self.block_size,
            )  # fmt: skip
        return out
