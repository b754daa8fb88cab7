"""Repack a GGUF's Q4_0/Q4_1 tensors into the int4 method's layout, from their blocks (no requantisation).

A Q4_1 block is 32 weights: fp16 d, fp16 m, then 16 bytes of nibbles (low nibbles are weights 0-15, high
nibbles 16-31), w = d * q + m. A Q4_0 block has no m and w = d * (q - 8). In the int4 method's convention
w = (q - 8) * scale + zero, so Q4_1 is scale = d, zero = m + 8d, and Q4_0 is scale = d, zero = 0: the codes q
carry over unchanged. The kernel reads scale and zero in bfloat16, so they are rounded once more there.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from engine.layers.quantization.weight_only import Int4LinearMethod

GGUF_BLOCK_SIZE = 32
# fused layer -> the checkpoint projections stacked in it, in row order
_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def unpack_q4_blocks(raw: np.ndarray, type_name: str, shape: tuple[int, int]) -> tuple[torch.Tensor, ...]:
    """(q int32 [N, K] in 0..15, d float32 [N, K/32], m float32 [N, K/32]) of a Q4_0 or Q4_1 tensor's bytes;
    w = d * q + m exactly as the gguf package dequantises (Q4_0: m = -8 d)."""
    rows, cols = shape
    blocks = np.ascontiguousarray(raw).reshape(rows * cols // GGUF_BLOCK_SIZE, -1)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    if type_name == "Q4_1":
        m, nibbles = blocks[:, 2:4].copy().view(np.float16).astype(np.float32), blocks[:, 4:]
    elif type_name == "Q4_0":
        m, nibbles = -8.0 * d, blocks[:, 2:]
    else:
        raise ValueError(f"not a Q4_0/Q4_1 tensor: {type_name}")
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=1).astype(np.int32)
    groups = cols // GGUF_BLOCK_SIZE
    return (
        torch.from_numpy(q.reshape(rows, cols)),
        torch.from_numpy(d.reshape(rows, groups)),
        torch.from_numpy(m.reshape(rows, groups)),
    )


def read_q4_tensors(
    gguf_path: Path, only: set[str] | None = None
) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Every Q4_0/Q4_1 weight of a GGUF file (or those named in `only`) by HF name: (q, scale, zero) in the int4
    method's convention, rows in HF order (llama.cpp's rotary permutation of Q/K undone as `engine.model_files`
    does for dense weights)."""
    import gguf

    from engine.model_files import gguf_hf_name, reverse_rope_permute

    reader = gguf.GGUFReader(str(gguf_path))
    arch = reader.fields["general.architecture"].contents()
    num_heads = reader.fields[f"{arch}.attention.head_count"].contents()
    kv_field = reader.fields.get(f"{arch}.attention.head_count_kv")
    num_kv_heads = kv_field.contents() if kv_field is not None else num_heads
    out = {}
    for tensor in reader.tensors:
        type_name = tensor.tensor_type.name
        if type_name not in ("Q4_0", "Q4_1") or (only is not None and gguf_hf_name(tensor.name) not in only):
            continue
        cols, rows = (int(x) for x in tensor.shape)
        q, d, m = unpack_q4_blocks(tensor.data, type_name, (rows, cols))
        scale, zero = d, m + 8.0 * d
        kind = tensor.name.split(".")[-2]
        if arch != "qwen2" and kind in ("attn_q", "attn_k"):
            heads = num_heads if kind == "attn_q" else num_kv_heads
            q, scale, zero = (reverse_rope_permute(t, heads) for t in (q, scale, zero))
        out[gguf_hf_name(tensor.name)] = (q, scale, zero)
    return out


def repack_gguf_int4(model: nn.Module, gguf_path: Path) -> list[str]:
    """Load the int4 layers whose checkpoint tensors are all Q4_0/Q4_1 blocks straight from those blocks.

    Only for group size 32 (the GGUF block) and one tensor-parallel rank; other layers keep the dense weights
    the loader copied, which `process_weights_after_loading` quantizes. Returns the repacked layers' names.
    """
    blocks = read_q4_tensors(gguf_path)
    repacked = []
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if not isinstance(method, Int4LinearMethod) or method.group_size != GGUF_BLOCK_SIZE:
            continue
        if getattr(module, "tp_size", 1) != 1:
            continue
        prefix, _, leaf = name.rpartition(".")
        parts = [f"model.{prefix}.{p}.weight" for p in _FUSED.get(leaf, (leaf,))]
        if not all(p in blocks for p in parts):
            continue
        q, scale, zero = (torch.cat([blocks[p][i] for p in parts]) for i in range(3))
        if q.shape != tuple(module.weight.shape):
            continue
        method.load_packed(module, q, scale.to(torch.bfloat16), zero.to(torch.bfloat16))
        repacked.append(name)
    return repacked
