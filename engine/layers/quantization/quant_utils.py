"""Weight quantizers and their exact dequantisations (the references the kernels are tested against).

int8: symmetric, one scale per output channel, q in [-127, 127], w ~ q * scale.
int4: asymmetric, one (scale, zero) per group of `group_size` input channels, q in [0, 15],
w ~ (q - 8) * scale + zero: the convention of torch's packed int4 CPU kernel (`zero` is the value of q = 8).
Scales and zeros are stored in bfloat16, the dtype the CPU kernels read them in.
"""

from __future__ import annotations

import torch

INT4_GROUP_SIZES = (32, 64, 128)


def quantize_int8_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 [N, K], scale float32 [N]) with weight ~ q * scale[:, None]; all-zero rows get scale 1."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale.float()[:, None]


def quantize_int4_groupwise(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q int32 [N, K] in [0, 15], scale bfloat16 [N, K/g], zero bfloat16 [N, K/g]).

    Each group's range [min, max] maps onto 0..15; q is computed against the bfloat16-rounded scale and zero, so
    the dequantisation error stays within half a step plus the bfloat16 rounding of the zero point.
    """
    rows, cols = weight.shape
    if cols % group_size:
        raise ValueError(f"group size {group_size} does not divide the input size {cols}")
    w = weight.detach().float().view(rows, cols // group_size, group_size)
    low, high = w.amin(dim=-1), w.amax(dim=-1)
    scale = ((high - low) / 15.0).clamp_(min=1e-8).to(torch.bfloat16)
    zero = (low + 8.0 * scale.float()).to(torch.bfloat16)
    q = torch.round((w - zero.float()[..., None]) / scale.float()[..., None] + 8.0).clamp_(0, 15)
    return q.to(torch.int32).view(rows, cols), scale, zero


def quantize_int8_groupwise(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 [N, K], scale float32 [N, K/g]): symmetric int8 with one scale per group of `group_size` inputs."""
    rows, cols = weight.shape
    if cols % group_size:
        raise ValueError(f"group size {group_size} does not divide the input size {cols}")
    w = weight.detach().float().view(rows, cols // group_size, group_size)
    scale = w.abs().amax(dim=-1) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / scale[..., None]).clamp_(-127, 127).to(torch.int8)
    return q.view(rows, cols), scale


def dequantize_int8_groupwise(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    rows, cols = q.shape
    return (q.float().view(rows, scale.shape[1], -1) * scale.float()[..., None]).view(rows, cols)


def split_int8_into_int4_pair(
    q: torch.Tensor, scale: torch.Tensor
) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Group-wise int8 (q, scale) as two int4 weights whose sum is exactly q * scale.

    q = 16 * hi + lo with hi in [-8, 7] and lo in [0, 15]: the high part is int4 q = hi + 8 with scale 16 * scale
    and zero 0, the low part q = lo with scale `scale` and zero 8 * scale (w = (q - 8) * scale + zero).
    """
    q16 = q.to(torch.int32)
    hi = torch.div(q16, 16, rounding_mode="floor")
    lo = q16 - 16 * hi
    scale_bf16 = scale.to(torch.bfloat16)
    high = (hi + 8, (scale_bf16.float() * 16).to(torch.bfloat16), torch.zeros_like(scale_bf16))
    low = (lo, scale_bf16, (scale_bf16.float() * 8).to(torch.bfloat16))
    return high, low


def dequantize_int4(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    rows, cols = q.shape
    groups = scale.shape[1]
    grouped = (q.float().view(rows, groups, cols // groups) - 8.0) * scale.float()[..., None] + zero.float()[..., None]
    return grouped.view(rows, cols)


def pack_int4_for_cpu(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed uint8 [N, K/2], scales_and_zeros bfloat16 [K/g, N, 2]) for `_weight_int4pack_mm_for_cpu`."""
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 1)
    scales_and_zeros = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)
    return packed, scales_and_zeros


def tensor_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes held by distinct tensor storages (a tied weight counts once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if not t.numel() or t.device.type == "meta":
            continue
        if t.is_mkldnn or t.layout != torch.strided:  # opaque (oneDNN-packed): no storage to share
            seen[id(t)] = t.numel() * t.element_size()
        else:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())
