"""Paged attention in Triton: split-K decode with GQA, and prefill/extend over cached context.

Both read K/V from the cache layout [2, num_kv_heads, num_blocks, block_size, head_dim] through padded
int32 block tables. A KV tile of BLOCK_N tokens looks up each token's block (`table[pos // block_size]`),
so any power-of-two block size works with the tile sizes tl.dot needs (>= 16). Softmax is the online
(flash) form, accumulated in float32.

* Decode: one program per (sequence, KV head, partition of PARTITION_SIZE tokens) computes all `group`
  query heads of that KV head, so each sequence's K/V is read once per layer whatever the GQA ratio.
  With one partition it writes the normalised output; otherwise it writes unnormalised partials and a
  second kernel merges them with their max and sum (split-K, for long contexts at small batch).
* Prefill/extend: one program per (sequence, query head, BLOCK_M query tokens): first the cached context
  [0, context) from the cache, all visible; then the chunk's own tokens from the fresh k/v tensors with
  the causal mask. With no context it needs no cache (the profiling run before the cache exists).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 32  # KV tokens per tile
BLOCK_M = 16  # query tokens per prefill program


@triton.jit
def _attend_tile(q, k, v, visible, m_i, l_i, acc, scale, DOT_PRECISION: tl.constexpr):
    """One online-softmax step: fold the KV tile k/v [TILE_N, D] into (max, sum, unnormalised acc) of q.
    k/v may be in the cache's dtype (kv_cache_dtype); both dots run in q's."""
    scores = tl.dot(q, tl.trans(k).to(q.dtype), input_precision=DOT_PRECISION) * scale
    scores = tl.where(visible, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    p = tl.exp(scores - m_new[:, None])
    alpha = tl.exp(m_i - m_new)
    acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=DOT_PRECISION)
    return m_new, l_i * alpha + tl.sum(p, 1), acc


@triton.jit
def _decode_kernel(
    q_ptr,
    cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    token_indices_ptr,
    out_ptr,
    part_acc_ptr,
    part_max_ptr,
    part_sum_ptr,
    scale,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_cache_kv,
    stride_cache_head,
    stride_cache_block,
    stride_cache_slot,
    stride_table,
    max_splits,
    GROUP: tl.constexpr,
    GROUP_P: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    PARTITION_SIZE: tl.constexpr,
    SINGLE_SPLIT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    seq, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    start = split * PARTITION_SIZE
    if start >= seq_len:
        return
    end = tl.minimum(start + PARTITION_SIZE, seq_len)
    token = tl.load(token_indices_ptr + seq).to(tl.int64)
    rows = tl.arange(0, GROUP_P)
    heads = kv_head * GROUP + rows
    dims = tl.arange(0, HEAD_DIM_P)
    row_mask, dim_mask = rows < GROUP, dims < HEAD_DIM
    q = tl.load(
        q_ptr + token * stride_qt + heads[:, None] * stride_qh + dims[None, :],
        mask=row_mask[:, None] & dim_mask[None, :],
        other=0.0,
    )
    m_i = tl.full([GROUP_P], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_P], tl.float32)
    acc = tl.zeros([GROUP_P, HEAD_DIM_P], tl.float32)
    head_base = cache_ptr + kv_head * stride_cache_head
    for tile_start in range(start, end, TILE_N):
        pos = tile_start + tl.arange(0, TILE_N)
        pos_mask = pos < end
        block = tl.load(block_tables_ptr + seq * stride_table + pos // BLOCK_SIZE, mask=pos_mask, other=0)
        offsets = block.to(tl.int64) * stride_cache_block + (pos % BLOCK_SIZE) * stride_cache_slot
        kv_mask = pos_mask[:, None] & dim_mask[None, :]
        k = tl.load(head_base + offsets[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        v = tl.load(head_base + stride_cache_kv + offsets[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        m_i, l_i, acc = _attend_tile(q, k, v, pos_mask[None, :], m_i, l_i, acc, scale, DOT_PRECISION)
    if SINGLE_SPLIT:
        dst = out_ptr + token * stride_ot + heads[:, None] * stride_oh + dims[None, :]
        tl.store(dst, (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & dim_mask[None, :])
    else:
        # partials: [num_decodes, num_heads, max_splits] (+ head_dim for acc)
        part = (seq * GROUP * tl.num_programs(1) + heads) * max_splits + split
        tl.store(part_max_ptr + part, m_i, mask=row_mask)
        tl.store(part_sum_ptr + part, l_i, mask=row_mask)
        acc_dst = part_acc_ptr + part[:, None] * HEAD_DIM_P + dims[None, :]
        tl.store(acc_dst, acc, mask=row_mask[:, None] & dim_mask[None, :])


@triton.jit
def _decode_merge_kernel(
    part_acc_ptr,
    part_max_ptr,
    part_sum_ptr,
    seq_lens_ptr,
    token_indices_ptr,
    out_ptr,
    stride_ot,
    stride_oh,
    max_splits,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
    PARTITION_SIZE: tl.constexpr,
    MAX_SPLITS_P: tl.constexpr,
):
    seq, head = tl.program_id(0), tl.program_id(1)
    num_splits = tl.cdiv(tl.load(seq_lens_ptr + seq), PARTITION_SIZE)
    splits = tl.arange(0, MAX_SPLITS_P)
    split_mask = splits < num_splits
    dims = tl.arange(0, HEAD_DIM_P)
    base = (seq * tl.num_programs(1) + head) * max_splits
    m = tl.load(part_max_ptr + base + splits, mask=split_mask, other=float("-inf"))
    s = tl.load(part_sum_ptr + base + splits, mask=split_mask, other=0.0)
    weight = tl.where(split_mask, tl.exp(m - tl.max(m, 0)), 0.0)
    acc = tl.load(
        part_acc_ptr + (base + splits)[:, None] * HEAD_DIM_P + dims[None, :], mask=split_mask[:, None], other=0.0
    )
    out = tl.sum(acc * weight[:, None], 0) / tl.sum(s * weight, 0)
    token = tl.load(token_indices_ptr + seq).to(tl.int64)
    tl.store(
        out_ptr + token * stride_ot + head * stride_oh + dims, out.to(out_ptr.dtype.element_ty), mask=dims < HEAD_DIM
    )


def _dot_precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"  # tf32 is ignored for half-precision inputs


def paged_decode_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    token_indices: torch.Tensor,
    out: torch.Tensor,
    scale: float,
    max_seq_len: int,
    partition_size: int = 512,
) -> None:
    """out[token_indices[i]] = attention of q[token_indices[i]] over sequence i's first seq_lens[i] cached tokens.

    q/out: [T, num_heads, head_dim]; block_tables: [n, max_blocks] int32; seq_lens, token_indices: [n] int32.
    `partition_size` (a multiple of BLOCK_N) is the split-K length; `max_seq_len` bounds the number of splits.
    """
    num_decodes = seq_lens.shape[0]
    if num_decodes == 0:
        return
    if partition_size % BLOCK_N:
        raise ValueError(f"partition_size must be a multiple of {BLOCK_N}, got {partition_size}")
    _, num_kv_heads, _, block_size, head_dim = kv_cache.shape
    num_heads = q.shape[1]
    group = num_heads // num_kv_heads
    head_dim_p = max(16, triton.next_power_of_2(head_dim))
    max_splits = triton.cdiv(max_seq_len, partition_size)
    single = max_splits == 1
    part_shape = (num_decodes, num_heads, max_splits)
    part_max = q.new_empty(part_shape if not single else (1,), dtype=torch.float32)
    part_sum = torch.empty_like(part_max)
    part_acc = q.new_empty((*part_shape, head_dim_p) if not single else (1,), dtype=torch.float32)
    common = {"HEAD_DIM": head_dim, "HEAD_DIM_P": head_dim_p, "PARTITION_SIZE": partition_size}
    _decode_kernel[(num_decodes, num_kv_heads, max_splits)](
        q, kv_cache, block_tables, seq_lens, token_indices, out, part_acc, part_max, part_sum, scale,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3), block_tables.stride(0),
        max_splits,
        GROUP=group, GROUP_P=max(16, triton.next_power_of_2(group)), BLOCK_SIZE=block_size, TILE_N=BLOCK_N,
        SINGLE_SPLIT=single, DOT_PRECISION=_dot_precision(q.dtype), **common,
    )  # fmt: skip
    if not single:
        _decode_merge_kernel[(num_decodes, num_heads)](
            part_acc, part_max, part_sum, seq_lens, token_indices, out, out.stride(0), out.stride(1), max_splits,
            MAX_SPLITS_P=triton.next_power_of_2(max_splits), **common,
        )  # fmt: skip


@triton.jit
def _prefill_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    cache_ptr,
    block_tables_ptr,
    query_start_ptr,
    query_lens_ptr,
    seq_lens_ptr,
    out_ptr,
    scale,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_cache_kv,
    stride_cache_head,
    stride_cache_block,
    stride_cache_slot,
    stride_table,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_M: tl.constexpr,
    TILE_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    seq, head, m_block = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    query_len = tl.load(query_lens_ptr + seq)
    if m_block * TILE_M >= query_len:
        return
    query_start = tl.load(query_start_ptr + seq).to(tl.int64)
    context = tl.load(seq_lens_ptr + seq) - query_len
    kv_head = head // GROUP
    rows = m_block * TILE_M + tl.arange(0, TILE_M)
    dims = tl.arange(0, HEAD_DIM_P)
    row_mask, dim_mask = rows < query_len, dims < HEAD_DIM
    q_mask = row_mask[:, None] & dim_mask[None, :]
    q = tl.load(
        q_ptr + (query_start + rows)[:, None] * stride_qt + head * stride_qh + dims[None, :], mask=q_mask, other=0.0
    )
    m_i = tl.full([TILE_M], float("-inf"), tl.float32)
    l_i = tl.zeros([TILE_M], tl.float32)
    acc = tl.zeros([TILE_M, HEAD_DIM_P], tl.float32)
    head_base = cache_ptr + kv_head * stride_cache_head
    for tile_start in range(0, context, TILE_N):  # cached context: every query token sees all of it
        pos = tile_start + tl.arange(0, TILE_N)
        pos_mask = pos < context
        block = tl.load(block_tables_ptr + seq * stride_table + pos // BLOCK_SIZE, mask=pos_mask, other=0)
        offsets = block.to(tl.int64) * stride_cache_block + (pos % BLOCK_SIZE) * stride_cache_slot
        kv_mask = pos_mask[:, None] & dim_mask[None, :]
        k = tl.load(head_base + offsets[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        v = tl.load(head_base + stride_cache_kv + offsets[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        m_i, l_i, acc = _attend_tile(q, k, v, pos_mask[None, :], m_i, l_i, acc, scale, DOT_PRECISION)
    causal_end = tl.minimum(query_len, (m_block + 1) * TILE_M)
    for tile_start in range(0, causal_end, TILE_N):  # the chunk's own tokens, causal
        pos = tile_start + tl.arange(0, TILE_N)
        pos_mask = pos < query_len
        kv_mask = pos_mask[:, None] & dim_mask[None, :]
        k = tl.load(
            k_ptr + (query_start + pos)[:, None] * stride_kt + kv_head * stride_kh + dims[None, :],
            mask=kv_mask,
            other=0.0,
        )
        v = tl.load(
            v_ptr + (query_start + pos)[:, None] * stride_vt + kv_head * stride_vh + dims[None, :],
            mask=kv_mask,
            other=0.0,
        )
        visible = pos_mask[None, :] & (pos[None, :] <= rows[:, None])
        m_i, l_i, acc = _attend_tile(q, k, v, visible, m_i, l_i, acc, scale, DOT_PRECISION)
    dst = out_ptr + (query_start + rows)[:, None] * stride_ot + head * stride_oh + dims[None, :]
    tl.store(dst, (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=q_mask)


def paged_prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor | None,
    block_tables: torch.Tensor,
    query_start: torch.Tensor,
    query_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    scale: float,
    max_query_len: int,
    block_size: int,
) -> None:
    """Causal attention of each chunk q[query_start[i] : + query_lens[i]] over its cached context
    (seq_lens[i] - query_lens[i] tokens, read through block_tables[i]) and its own k/v; writes `out` there.

    q/out: [T, num_heads, head_dim]; k/v: [T, num_kv_heads, head_dim]; the int32 tensors have one entry per
    chunk. `kv_cache` may be None only when no chunk has context.
    """
    num_prefills = query_lens.shape[0]
    if num_prefills == 0:
        return
    num_heads, head_dim = q.shape[1], q.shape[2]
    group = num_heads // k.shape[1]
    cache = kv_cache if kv_cache is not None else k  # never read: every context is 0
    cache_strides = kv_cache.stride()[:4] if kv_cache is not None else (0, 0, 0, 0)
    _prefill_kernel[(num_prefills, num_heads, triton.cdiv(max_query_len, BLOCK_M))](
        q, k, v, cache, block_tables, query_start, query_lens, seq_lens, out, scale,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        *cache_strides, block_tables.stride(0),
        GROUP=group, HEAD_DIM=head_dim, HEAD_DIM_P=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_SIZE=block_size, TILE_M=BLOCK_M, TILE_N=BLOCK_N, DOT_PRECISION=_dot_precision(q.dtype),
    )  # fmt: skip
