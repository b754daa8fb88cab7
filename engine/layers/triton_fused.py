"""Fused Triton kernels for the decoder's elementwise steps: residual add + RMSNorm, and SiLU(gate) * up.

Eager torch runs each as 2-6 kernels (add, square, mean, rsqrt, two multiplies; silu then multiply), each a
pass over the activations; the fused kernels make one pass. They round where torch (and HF Llama) round:
the residual sum and silu(gate) to the activation dtype, the norm in float32, the weight product in the
activation dtype; in float32 they differ from torch only in the order of the mean's sum.

`use_triton_fused_layers(model)` switches a model's RMSNorm and SiluAndMul modules to these kernels; the
model runner does it when the attention backend is triton (so on CUDA by default).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import nn

SILU_BLOCK = 1024


@triton.jit
def _add_rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    residual_out_ptr,
    stride_x,
    stride_residual,
    num_cols,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < num_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row * stride_residual + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + residual.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(residual_out_ptr + row * num_cols + cols, x, mask=mask)
    xf = x.to(tl.float32)
    normed = xf * tl.rsqrt(tl.sum(xf * xf, 0) / num_cols + eps)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    out = weight * normed.to(x_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * num_cols + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def add_rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm.forward's contract: norm(x), or (norm(x + residual), x + residual). x: [T, hidden], row-major."""
    if x.stride(-1) != 1 or (residual is not None and residual.stride(-1) != 1):
        raise ValueError("add_rms_norm needs rows with a contiguous last dim")
    num_rows, num_cols = x.shape
    out = torch.empty((num_rows, num_cols), dtype=x.dtype, device=x.device)
    residual_out = torch.empty_like(out) if residual is not None else out
    if num_rows:
        _add_rms_norm_kernel[(num_rows,)](
            x, residual if residual is not None else x, weight, out, residual_out,
            x.stride(0), residual.stride(0) if residual is not None else 0, num_cols, eps,
            HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(num_cols),
        )  # fmt: skip
    return out if residual is None else (out, residual_out)


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, num_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < num_cols
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + num_cols + cols, mask=mask, other=0.0).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(x_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * num_cols + cols, (silu * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for x = [gate | up] along the last dim; x: [T, 2 * n] -> [T, n]."""
    if x.stride(-1) != 1:
        raise ValueError("silu_and_mul needs rows with a contiguous last dim")
    num_rows, num_cols = x.shape[0], x.shape[1] // 2
    out = torch.empty((num_rows, num_cols), dtype=x.dtype, device=x.device)
    if num_rows:
        grid = (num_rows, triton.cdiv(num_cols, SILU_BLOCK))
        _silu_and_mul_kernel[grid](x, out, x.stride(0), num_cols, BLOCK=SILU_BLOCK)
    return out


def use_triton_fused_layers(model: nn.Module) -> int:
    """Point every RMSNorm and SiluAndMul module of `model` at the kernels above; returns how many it switched."""
    from engine.layers.activation import SiluAndMul
    from engine.layers.layernorm import RMSNorm

    switched = 0
    for module in model.modules():
        if isinstance(module, RMSNorm):
            module.fused_kernel = add_rms_norm
        elif isinstance(module, SiluAndMul):
            module.fused_kernel = silu_and_mul
        else:
            continue
        switched += 1
    return switched
