"""Paged attention in plain torch (CPU and GPU), built around two batched paths.

KV cache layout per layer: [2, num_kv_heads, num_blocks, block_size, head_dim]. Heads lead so that
gathering a sequence's blocks with `index_select` on dim 2 yields [kv_heads, ..., tokens, head_dim],
already in the layout the batched matmuls of SDPA want (no transposed copy of K/V). The cache may have another
dtype than the model (kv_cache_dtype): the write casts K/V to it, every read casts back to the query's dtype.

* Decodes (query length 1) run as ONE SDPA call per layer: block tables are padded into a
  [num_decodes, max_blocks] index, the KV is gathered into [kv_heads, num_decodes, max_blocks *
  block_size, head_dim], and a length mask hides the padding. The query heads of one KV group are
  folded into the query-length dimension ([kv_heads, num_decodes, group, head_dim]), so GQA needs no
  repeated K/V.
* Decode mirror: when a step's decodes are exactly the previous step's, each one token longer (the steady
  state of continuous batching), the gather is skipped: every layer keeps its decodes' K/V from the last
  step in a padded "mirror" ([2, kv_heads, num_decodes, capacity, head_dim], a few blocks of headroom)
  and only appends the new token. Any change of the decode set, or outgrowing the headroom, rebuilds it
  with one gather; mirrors above MIRROR_BYTES_PER_LAYER fall back to gathering every step.
* Several query tokens of a request with cached context (a verification step: the last token and its
  drafts) run as a prefill chunk with context, never through the decode path; the request thereby leaves
  the decode set, so the mirror is rebuilt from the cache when it decodes again and never holds the KV
  of a rejected draft.
* Prefill chunks run one SDPA call per sequence: with no cached context the fresh K/V and
  `is_causal=True`; with context (a later chunk or a prefix-cache hit) the sequence's gathered KV and
  a causal mask offset by the context length.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from engine.attention.backend import AttentionBackend, AttentionMetadata

MIRROR_BYTES_PER_LAYER = 32 * 2**20
MIRROR_HEADROOM_BLOCKS = 4


class DecodeMirror(enum.Enum):
    OFF = "off"  # gather the decodes' KV from the cache every layer
    REBUILD = "rebuild"  # gather it into a fresh mirror
    APPEND = "append"  # the mirror holds last step's KV: write only the new token


@dataclass
class PrefillChunk:
    token_start: int
    num_tokens: int
    seq_len: int  # context including this chunk
    block_ids: torch.Tensor | None  # None: no cached context, attend to the fresh K/V only
    mask: torch.Tensor | None  # [num_tokens, seq_len] bool, True = attend


@dataclass
class DecodeBatch:
    """A step's decodes: their rows in the flat batch, block tables (used blocks only) and context lengths."""

    rows: list[int] = field(default_factory=list)
    tables: list[list[int]] = field(default_factory=list)
    lens: list[int] = field(default_factory=list)


@dataclass
class TorchAttentionMetadata(AttentionMetadata):
    num_decodes: int = 0
    decode_token_indices: torch.Tensor | None = None  # [num_decodes]; None when decodes are tokens 0..n-1
    decode_block_ids: torch.Tensor | None = None  # [num_decodes * max_blocks] padded block tables
    decode_mask: torch.Tensor | None = None  # [1, num_decodes, 1, max_blocks * block_size] bool
    decode_bias: torch.Tensor | None = None  # the same as a float32 additive mask (0 / -inf)
    prefills: list[PrefillChunk] = field(default_factory=list)
    write_indices: torch.Tensor | None = None  # tokens whose slot is >= 0, when some are -1
    decode_kv_buffer: torch.Tensor | None = None  # the decodes' gathered K/V, allocated by the first layer
    decode_mirror: DecodeMirror = DecodeMirror.OFF
    decode_positions: torch.Tensor | None = None  # [num_decodes] position of each decode token


class TorchAttentionBackend(AttentionBackend):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, block_size: int) -> None:
        super().__init__(num_heads, num_kv_heads, head_dim, scale, block_size)
        self._mirror_storage: dict[int, torch.Tensor] = {}  # per layer, keyed by the KV cache's data pointer
        self._mirror_blocks = 0  # capacity of the current mirrors in blocks per sequence; 0 = no valid mirror
        self._last_decodes: tuple[list[list[int]], list[int]] | None = None

    def _plan_decode_mirror(self, tables: list[list[int]], lens: list[int]) -> DecodeMirror:
        previous, self._last_decodes = self._last_decodes, (tables, lens)
        if (
            previous is not None
            and self._mirror_blocks
            and len(previous[1]) == len(lens)
            and max(len(t) for t in tables) <= self._mirror_blocks
            and all(n == p + 1 for n, p in zip(lens, previous[1], strict=True))
            and all(t[: len(p)] == p for t, p in zip(tables, previous[0], strict=True))
        ):
            return DecodeMirror.APPEND
        blocks = max(len(t) for t in tables) + MIRROR_HEADROOM_BLOCKS
        per_layer = 2 * self.num_kv_heads * len(tables) * blocks * self.block_size * self.head_dim * 4
        if per_layer > MIRROR_BYTES_PER_LAYER:
            self._mirror_blocks = 0
            self._mirror_storage.clear()
            return DecodeMirror.OFF
        self._mirror_blocks = blocks
        return DecodeMirror.REBUILD

    metadata_type: type[TorchAttentionMetadata] = TorchAttentionMetadata

    def build_metadata(
        self,
        query_lens: list[int],
        seq_lens: list[int],
        block_tables: list[list[int]],
        slot_mapping: torch.Tensor,
        device: torch.device,
    ) -> TorchAttentionMetadata:
        metadata, decodes = self._split_step(query_lens, seq_lens, block_tables, slot_mapping, device)
        if not decodes.rows:
            self._last_decodes, self._mirror_blocks = None, 0
        else:
            self._decode_metadata(metadata, decodes, device)
        return metadata

    def _split_step(
        self,
        query_lens: list[int],
        seq_lens: list[int],
        block_tables: list[list[int]],
        slot_mapping: torch.Tensor,
        device: torch.device,
    ) -> tuple[TorchAttentionMetadata, DecodeBatch]:
        """The step's prefill chunks in a fresh metadata, and its decodes (query length 1 with context) apart."""
        bs = self.block_size
        decodes = DecodeBatch()
        prefills: list[PrefillChunk] = []
        start = 0
        for query_len, seq_len, table in zip(query_lens, seq_lens, block_tables, strict=True):
            num_blocks = -(-seq_len // bs)
            if len(table) < num_blocks:
                raise ValueError(f"a sequence of {seq_len} tokens needs {num_blocks} blocks, got {len(table)}")
            if query_len == 1 and seq_len > 1:
                decodes.rows.append(start)
                decodes.tables.append(table[:num_blocks])
                decodes.lens.append(seq_len)
            elif seq_len == query_len:
                prefills.append(PrefillChunk(start, query_len, seq_len, None, None))
            else:
                context = seq_len - query_len
                rows = torch.arange(query_len, device=device)[:, None] + context
                mask = torch.arange(seq_len, device=device)[None, :] <= rows
                ids = torch.tensor(table[:num_blocks], dtype=torch.long, device=device)
                prefills.append(PrefillChunk(start, query_len, seq_len, ids, mask))
            start += query_len
        metadata = self.metadata_type(num_tokens=start, slot_mapping=slot_mapping, prefills=prefills)
        if bool((slot_mapping < 0).any()):
            metadata.write_indices = (slot_mapping >= 0).nonzero().squeeze(1)
        return metadata, decodes

    def _decode_metadata(self, metadata: TorchAttentionMetadata, decodes: DecodeBatch, device: torch.device) -> None:
        """The padded gather index and length mask of the batched decode path, and its mirror plan."""
        bs, decode_tables = self.block_size, decodes.tables
        max_blocks = max(len(t) for t in decode_tables)
        metadata.decode_mirror = self._plan_decode_mirror(decode_tables, decodes.lens)
        width = self._mirror_blocks if metadata.decode_mirror == DecodeMirror.REBUILD else max_blocks
        padded = [t + t[:1] * (width - len(t)) for t in decode_tables]  # pad with a written block
        lens = torch.tensor(decodes.lens, device=device)
        metadata.decode_positions = lens - 1
        metadata.num_decodes = len(decodes.rows)
        metadata.decode_block_ids = torch.tensor(padded, dtype=torch.long, device=device).view(-1)
        metadata.decode_mask = (torch.arange(max_blocks * bs, device=device)[None, :] < lens[:, None])[None, :, None, :]
        metadata.decode_bias = torch.zeros(metadata.decode_mask.shape, device=device).masked_fill_(
            ~metadata.decode_mask, float("-inf")
        )
        if decodes.rows != list(range(len(decodes.rows))):
            metadata.decode_token_indices = torch.tensor(decodes.rows, dtype=torch.long, device=device)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor | None,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        assert isinstance(metadata, TorchAttentionMetadata)
        if kv_cache is not None:
            self._write_kv(k, v, kv_cache, metadata)
        out = torch.empty_like(q)
        if metadata.num_decodes:
            self._decode(q, k, v, out, kv_cache, metadata)
        for chunk in metadata.prefills:
            self._prefill(q, k, v, out, kv_cache, chunk)
        return out

    def _write_kv(self, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, md: TorchAttentionMetadata) -> None:
        flat = kv_cache.view(2, self.num_kv_heads, -1, self.head_dim)
        slot_mapping = md.slot_mapping
        if md.write_indices is not None:
            k, v = k.index_select(0, md.write_indices), v.index_select(0, md.write_indices)
            slot_mapping = slot_mapping.index_select(0, md.write_indices)
        flat[0].index_copy_(1, slot_mapping, k.transpose(0, 1).to(flat.dtype))
        flat[1].index_copy_(1, slot_mapping, v.transpose(0, 1).to(flat.dtype))

    def _gather(
        self, kv_cache: torch.Tensor, block_ids: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """[kv_heads, len(block_ids) * block_size, head_dim] for K and V of the given blocks, as `dtype`."""
        gathered = kv_cache.index_select(2, block_ids).to(dtype)
        shape = (self.num_kv_heads, -1, self.head_dim)
        return gathered[0].view(shape), gathered[1].view(shape)

    def _decode_kv(
        self, kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, md: TorchAttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of the decodes as [kv_heads, num_decodes, padded_len, head_dim] (padding masked later)."""
        n, kvh, bs, dim, ids = md.num_decodes, self.num_kv_heads, self.block_size, self.head_dim, md.decode_block_ids
        assert ids is not None
        if md.decode_mirror == DecodeMirror.OFF:  # one gather buffer per step, reused by every layer
            if md.decode_kv_buffer is None:
                md.decode_kv_buffer = kv_cache.new_empty((2, kvh, ids.numel(), bs, dim))
            kv = torch.index_select(kv_cache, 2, ids, out=md.decode_kv_buffer).view(2, kvh, n, -1, dim)
            kv = kv.to(k.dtype)
            return kv[0], kv[1]
        shape = (2, kvh, n, self._mirror_blocks * bs, dim)
        needed = 2 * kvh * n * self._mirror_blocks * bs * dim
        storage = self._mirror_storage.get(kv_cache.data_ptr())
        if md.decode_mirror == DecodeMirror.REBUILD:
            if storage is None or storage.numel() < needed:
                storage = self._mirror_storage[kv_cache.data_ptr()] = kv_cache.new_empty(needed)
            mirror = storage[:needed].view(shape)
            torch.index_select(kv_cache, 2, ids, out=mirror.view(2, kvh, -1, bs, dim))
        else:
            assert storage is not None
            mirror = storage[:needed].view(shape)
            idx, rows = md.decode_token_indices, torch.arange(n, device=k.device)
            new_k = k[:n] if idx is None else k.index_select(0, idx)
            new_v = v[:n] if idx is None else v.index_select(0, idx)
            mirror[0][:, rows, md.decode_positions] = new_k.transpose(0, 1).to(mirror.dtype)
            mirror[1][:, rows, md.decode_positions] = new_v.transpose(0, 1).to(mirror.dtype)
        if mirror.dtype != k.dtype:  # a kv_cache_dtype unlike the model's: the mirror holds the stored values
            mirror = mirror.to(k.dtype)
        return mirror[0], mirror[1]

    def _decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        kv_cache: torch.Tensor | None,
        md: TorchAttentionMetadata,
    ) -> None:
        if kv_cache is None:
            raise ValueError("decode tokens need a KV cache")
        n, kvh, group = md.num_decodes, self.num_kv_heads, self.num_heads // self.num_kv_heads
        idx = md.decode_token_indices
        q_dec = q[:n] if idx is None else q.index_select(0, idx)
        key, value = self._decode_kv(kv_cache, k, v, md)
        length = md.decode_mask.shape[-1]  # type: ignore[union-attr]
        key, value = key[:, :, :length], value[:, :, :length]
        q_dec = q_dec.view(n, kvh, group, self.head_dim).transpose(0, 1)  # [kvh, n, group, head_dim]
        if q_dec.dtype == torch.float32:
            # Two batched matmuls + softmax beat SDPA's flash kernel by ~30 % at a query length of `group`.
            scores = torch.matmul(q_dec, key.transpose(-1, -2))
            scores.mul_(self.scale).add_(md.decode_bias)  # type: ignore[arg-type]
            o = torch.matmul(torch.softmax(scores, dim=-1), value)
        else:  # SDPA accumulates in float32 for half-precision inputs
            o = F.scaled_dot_product_attention(q_dec, key, value, attn_mask=md.decode_mask, scale=self.scale)
        o = o.transpose(0, 1).reshape(n, self.num_heads, self.head_dim)
        if idx is None:
            out[:n] = o
        else:
            out.index_copy_(0, idx, o)

    def _prefill(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        kv_cache: torch.Tensor | None,
        chunk: PrefillChunk,
    ) -> None:
        s, e = chunk.token_start, chunk.token_start + chunk.num_tokens
        # 4-D inputs: torch's CPU flash-attention kernel handles them (3-D falls back to the slow math path).
        q_seq = q[None, s:e].transpose(1, 2)  # [1, heads, tokens, head_dim]
        if chunk.block_ids is None:
            key, value = k[None, s:e].transpose(1, 2), v[None, s:e].transpose(1, 2)
            o = F.scaled_dot_product_attention(q_seq, key, value, is_causal=True, scale=self.scale, enable_gqa=True)
        else:
            if kv_cache is None:
                raise ValueError("a prefill chunk with cached context needs a KV cache")
            key, value = self._gather(kv_cache, chunk.block_ids, q.dtype)
            key, value = key[None, :, : chunk.seq_len], value[None, :, : chunk.seq_len]
            o = F.scaled_dot_product_attention(
                q_seq, key, value, attn_mask=chunk.mask, scale=self.scale, enable_gqa=True
            )
        out[s:e] = o[0].transpose(0, 1)
