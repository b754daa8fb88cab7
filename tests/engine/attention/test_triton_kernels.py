"""The Triton paged-attention kernels against torch references, interpreted on the CPU (TRITON_INTERPRET=1).

Shapes are small but cross the kernels' edges: odd lengths, lengths on and around block and tile (32)
boundaries, GQA ratios 1/3/8, block sizes 16 and 32, block tables with unused trailing blocks, split-K on
and off.
"""

from __future__ import annotations

import pytest
import torch

from engine.attention.ops.triton_kv_cache import write_kv_cache
from engine.attention.ops.triton_paged_attention import paged_decode_attention, paged_prefill_attention

HEAD_DIM, NUM_KV_HEADS, SCALE = 16, 2, 0.3


def dense_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context: int) -> torch.Tensor:
    """q: [n, H, D] at positions context..context+n-1; k/v: [context+n, KVH, D]; causal, float64 -> [n, H, D]."""
    group = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * SCALE
    allowed = torch.arange(k.shape[0])[None, :] <= (torch.arange(q.shape[0]) + context)[:, None]
    return torch.einsum("hqk,khd->qhd", scores.masked_fill(~allowed, float("-inf")).softmax(-1), v).float()


def fill_cache(cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocks: list[int]) -> None:
    """Put positions 0..len(k)-1 of one sequence into its blocks (plain indexing, independent of the kernels)."""
    block_size = cache.shape[3]
    for pos in range(k.shape[0]):
        cache[0, :, blocks[pos // block_size], pos % block_size] = k[pos]
        cache[1, :, blocks[pos // block_size], pos % block_size] = v[pos]


def padded_tables(tables: list[list[int]]) -> torch.Tensor:
    width = max(len(t) for t in tables)
    return torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)


@pytest.mark.parametrize("block_size", [16, 32])
def test_kv_cache_write_puts_each_token_in_its_slot_and_skips_negative_slots(block_size: int) -> None:
    torch.manual_seed(block_size)
    cache = torch.zeros(2, NUM_KV_HEADS, 6, block_size, HEAD_DIM)
    qkv = torch.randn(5, 7, HEAD_DIM)  # k and v as strided views of a fused projection, as the model passes them
    k, v = qkv[:, 3:5], qkv[:, 5:7]
    slots = [0, -1, block_size - 1, block_size, 6 * block_size - 1]
    write_kv_cache(k, v, cache, torch.tensor(slots))
    expected = torch.zeros_like(cache)
    flat = expected.view(2, NUM_KV_HEADS, -1, HEAD_DIM)
    for token, slot in enumerate(slots):
        if slot >= 0:
            flat[0, :, slot], flat[1, :, slot] = k[token], v[token]
    assert torch.equal(cache, expected)


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("group", [1, 3, 8])
@pytest.mark.parametrize("partition_size", [32, 512])
def test_decode_attention_matches_dense(block_size: int, group: int, partition_size: int) -> None:
    """Decodes of lengths 1..97 (block and tile boundaries), in batch rows after some other tokens; with a
    32-token partition the long ones are split-K. Rows that are not decodes stay untouched."""
    torch.manual_seed(group * 100 + block_size)
    heads, num_blocks = NUM_KV_HEADS * group, 24
    lens = [1, 15, 16, 17, 33, 64, 97] if block_size == 16 else [2, 31, 32, 63, 97]
    cache = torch.randn(2, NUM_KV_HEADS, num_blocks, block_size, HEAD_DIM)  # unused slots hold garbage
    free = torch.randperm(num_blocks).tolist()
    tables, seqs = [], []
    for n in lens:
        blocks = [free.pop() for _ in range(-(-n // block_size) + (n == lens[0]))]  # one table has a spare block
        k, v = torch.randn(n, NUM_KV_HEADS, HEAD_DIM), torch.randn(n, NUM_KV_HEADS, HEAD_DIM)
        fill_cache(cache, k, v, blocks)
        tables.append(blocks)
        seqs.append((k, v))
    rows = [2 * i + 1 for i in range(len(lens))]  # decodes interleaved with other rows
    q = torch.randn(2 * len(lens) + 1, heads, HEAD_DIM)
    out = torch.full_like(q, 7.0)
    paged_decode_attention(
        q, cache, padded_tables(tables), torch.tensor(lens, dtype=torch.int32), torch.tensor(rows, dtype=torch.int32),
        out, SCALE, max(lens), partition_size,
    )  # fmt: skip
    for row, n, (k, v) in zip(rows, lens, seqs, strict=True):
        torch.testing.assert_close(out[row : row + 1], dense_reference(q[row : row + 1], k, v, n - 1))
    assert bool((out[0::2] == 7.0).all())


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("group", [1, 3, 8])
def test_prefill_attention_with_cached_context_matches_dense(block_size: int, group: int) -> None:
    """Chunks (context, new tokens): fresh prefills of odd and tile-boundary lengths, chunks behind a context
    that ends on a block boundary or inside a block, and a one-token chunk (a verification step's shape)."""
    torch.manual_seed(group * 10 + block_size)
    heads, num_blocks = NUM_KV_HEADS * group, 24
    shapes = [(0, 1), (0, 17), (0, 33), (block_size, 16), (5, 30), (33, 3), (2 * block_size, 1)]
    cache = torch.randn(2, NUM_KV_HEADS, num_blocks, block_size, HEAD_DIM)
    free = torch.randperm(num_blocks).tolist()
    q_rows, k_rows, v_rows, tables, seqs = [], [], [], [], []
    for context, new in shapes:
        total = context + new
        q, k, v = (
            torch.randn(new, heads, HEAD_DIM),
            torch.randn(total, NUM_KV_HEADS, HEAD_DIM),
            torch.randn(total, NUM_KV_HEADS, HEAD_DIM),
        )
        blocks = [free.pop() for _ in range(-(-total // block_size))]
        fill_cache(cache, k[:context], v[:context], blocks)  # only the context is cached; the chunk comes fresh
        q_rows.append(q)
        k_rows.append(k[context:])
        v_rows.append(v[context:])
        tables.append(blocks)
        seqs.append((q, k, v, context))
    new_lens = [n for _, n in shapes]
    starts = [sum(new_lens[:i]) for i in range(len(shapes))]
    q, k, v = torch.cat(q_rows), torch.cat(k_rows), torch.cat(v_rows)
    out = torch.empty_like(q)
    paged_prefill_attention(
        q, k, v, cache, padded_tables(tables), torch.tensor(starts, dtype=torch.int32),
        torch.tensor(new_lens, dtype=torch.int32), torch.tensor([c + n for c, n in shapes], dtype=torch.int32),
        out, SCALE, max(new_lens), block_size,
    )  # fmt: skip
    for start, (q_seq, k_seq, v_seq, context) in zip(starts, seqs, strict=True):
        expected = dense_reference(q_seq, k_seq, v_seq, context)
        torch.testing.assert_close(out[start : start + q_seq.shape[0]], expected)


def test_fresh_prefills_need_no_cache() -> None:
    """The profiling run attends before the KV cache exists: chunks without context never touch it."""
    torch.manual_seed(5)
    q, k, v = (
        torch.randn(20, 6, HEAD_DIM),
        torch.randn(20, NUM_KV_HEADS, HEAD_DIM),
        torch.randn(20, NUM_KV_HEADS, HEAD_DIM),
    )
    out = torch.empty_like(q)
    ints = {"dtype": torch.int32}
    paged_prefill_attention(
        q, k, v, None, torch.zeros(2, 1, **ints), torch.tensor([0, 7], **ints), torch.tensor([7, 13], **ints),
        torch.tensor([7, 13], **ints), out, SCALE, 13, 16,
    )  # fmt: skip
    torch.testing.assert_close(out[:7], dense_reference(q[:7], k[:7], v[:7], 0))
    torch.testing.assert_close(out[7:], dense_reference(q[7:], k[7:], v[7:], 0))
