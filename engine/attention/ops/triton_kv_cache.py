"""The KV-cache write as a Triton kernel: token t's K/V go to flat slot `slot_mapping[t]` (-1: skipped).

Cache layout per layer (shared with the torch backend): [2, num_kv_heads, num_blocks, block_size, head_dim].
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _write_kv_kernel(
    k_ptr,
    v_ptr,
    cache_ptr,
    slot_mapping_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cache_kv,
    stride_cache_head,
    stride_cache_slot,
    NUM_KV_HEADS: tl.constexpr,
    NUM_KV_HEADS_P: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    heads = tl.arange(0, NUM_KV_HEADS_P)
    dims = tl.arange(0, HEAD_DIM_P)
    mask = (heads[:, None] < NUM_KV_HEADS) & (dims[None, :] < HEAD_DIM)
    k = tl.load(k_ptr + token * stride_kt + heads[:, None] * stride_kh + dims[None, :], mask=mask)
    v = tl.load(v_ptr + token * stride_vt + heads[:, None] * stride_vh + dims[None, :], mask=mask)
    dst = cache_ptr + heads[:, None] * stride_cache_head + slot * stride_cache_slot + dims[None, :]
    tl.store(dst, k.to(cache_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + stride_cache_kv, v.to(cache_ptr.dtype.element_ty), mask=mask)


def write_kv_cache(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """k/v: [T, num_kv_heads, head_dim] (last dim contiguous); kv_cache: [2, kv_heads, blocks, block_size, head_dim]."""
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    if k.stride(2) != 1 or v.stride(2) != 1 or not kv_cache.is_contiguous():
        raise ValueError("write_kv_cache needs k/v with a contiguous last dim and a contiguous cache")
    _write_kv_kernel[(num_tokens,)](
        k,
        v,
        kv_cache,
        slot_mapping,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        kv_cache.stride(0),
        kv_cache.stride(1),
        kv_cache.stride(3),  # slots of one head are contiguous across blocks: slot * stride(3)
        NUM_KV_HEADS=num_kv_heads,
        NUM_KV_HEADS_P=triton.next_power_of_2(num_kv_heads),
        HEAD_DIM=head_dim,
        HEAD_DIM_P=triton.next_power_of_2(head_dim),
    )
