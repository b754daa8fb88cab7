"""Every Triton kernel against a torch reference on random inputs: the first part of `bench check gpu`.

The cases cover GQA ratios 1/4/8, block sizes 16 and 32, split-K on and off, prefill chunks with and without
cached context, the KV-cache write and the fused norm and activation kernels. `length` scales the sequence
lengths: the GPU check uses contexts up to ~1000 tokens at head_dim 128; the tests run short ones under
TRITON_INTERPRET=1 on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Max abs error allowed against the float32 reference: float32 kernels differ only in summation order;
# bfloat16 kernels round their inputs and outputs (attention outputs are O(1), norms O(weight)).
TOLERANCES = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 5e-3}


@dataclass
class KernelCheck:
    name: str
    max_abs_error: float
    tolerance: float

    @property
    def passed(self) -> bool:
        return self.max_abs_error <= self.tolerance  # a NaN error fails


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context: int, scale: float) -> torch.Tensor:
    """Causal attention in float32 (torch SDPA): q [n, H, D] at positions context.., k/v [context+n, KVH, D]."""
    group = q.shape[1] // k.shape[1]
    n, total = q.shape[0], k.shape[0]
    mask = torch.arange(total, device=q.device)[None, :] <= (torch.arange(n, device=q.device) + context)[:, None]
    out = torch.nn.functional.scaled_dot_product_attention(
        q.float().transpose(0, 1),
        k.float().repeat_interleave(group, 1).transpose(0, 1),
        v.float().repeat_interleave(group, 1).transpose(0, 1),
        attn_mask=mask,
        scale=scale,
    )
    return out.transpose(0, 1)


def paged_cache(
    seqs: list[tuple[torch.Tensor, torch.Tensor]], block_size: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """A KV cache holding each sequence's (k, v) [len, kv_heads, head_dim] in shuffled blocks (the other slots
    random), and the int32 block tables padded with block 0."""
    k0 = seqs[0][0]
    lengths = [-(-k.shape[0] // block_size) for k, _ in seqs]
    num_blocks = sum(lengths) + 1
    cache = torch.randn(2, k0.shape[1], num_blocks, block_size, k0.shape[2], device=k0.device).to(dtype)
    free = torch.randperm(num_blocks).tolist()
    tables = []
    for (k, v), n in zip(seqs, lengths, strict=True):
        blocks = [free.pop() for _ in range(n)]
        positions = torch.arange(k.shape[0], device=k.device)
        block_ids = torch.tensor(blocks, device=k.device)[positions // block_size]
        cache[0, :, block_ids, positions % block_size] = k.transpose(0, 1).to(dtype)
        cache[1, :, block_ids, positions % block_size] = v.transpose(0, 1).to(dtype)
        tables.append(blocks + [0] * (max(lengths) - n))
    return cache, torch.tensor(tables, dtype=torch.int32, device=k0.device)


def _random(*shape: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.randn(*shape, device=device).to(dtype)


def check_decode(
    group: int,
    block_size: int,
    partition_size: int,
    lens: list[int],
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
) -> KernelCheck:
    from engine.attention.ops.triton_paged_attention import paged_decode_attention

    kv_heads, scale = 2, head_dim**-0.5
    seqs = [tuple(_random(n, kv_heads, head_dim, dtype=dtype, device=device) for _ in "kv") for n in lens]
    cache, tables = paged_cache(seqs, block_size, dtype)
    q = _random(len(lens), kv_heads * group, head_dim, dtype=dtype, device=device)
    out = torch.empty_like(q)
    ints = {"dtype": torch.int32, "device": device}
    paged_decode_attention(
        q, cache, tables, torch.tensor(lens, **ints), torch.arange(len(lens), **ints), out, scale, max(lens),
        partition_size,
    )  # fmt: skip
    error = max(
        (out[i : i + 1].float() - dense_attention(q[i : i + 1], k, v, n - 1, scale)).abs().max().item()
        for i, ((k, v), n) in enumerate(zip(seqs, lens, strict=True))
    )
    name = f"decode gqa={group} block={block_size} partition={partition_size} lens={min(lens)}..{max(lens)}"
    return KernelCheck(name, error, TOLERANCES[dtype])


def check_prefill(
    group: int, block_size: int, shapes: list[tuple[int, int]], head_dim: int, dtype: torch.dtype, device: torch.device
) -> KernelCheck:
    """shapes: (cached context, new tokens) per chunk."""
    from engine.attention.ops.triton_paged_attention import paged_prefill_attention

    kv_heads, scale = 2, head_dim**-0.5
    seqs = [tuple(_random(c + n, kv_heads, head_dim, dtype=dtype, device=device) for _ in "kv") for c, n in shapes]
    cache, tables = paged_cache(seqs, block_size, dtype)
    q = _random(sum(n for _, n in shapes), kv_heads * group, head_dim, dtype=dtype, device=device)
    k_new = torch.cat([k[c:] for (k, _), (c, _) in zip(seqs, shapes, strict=True)])
    v_new = torch.cat([v[c:] for (_, v), (c, _) in zip(seqs, shapes, strict=True)])
    starts = [sum(n for _, n in shapes[:i]) for i in range(len(shapes))]
    out = torch.empty_like(q)
    ints = {"dtype": torch.int32, "device": device}
    paged_prefill_attention(
        q, k_new, v_new, cache, tables, torch.tensor(starts, **ints), torch.tensor([n for _, n in shapes], **ints),
        torch.tensor([c + n for c, n in shapes], **ints), out, scale, max(n for _, n in shapes), block_size,
    )  # fmt: skip
    error = 0.0
    for (k, v), (context, new), start in zip(seqs, shapes, starts, strict=True):
        expected = dense_attention(q[start : start + new], k, v, context, scale)
        error = max(error, (out[start : start + new].float() - expected).abs().max().item())
    name = f"prefill gqa={group} block={block_size} chunks={shapes}"
    return KernelCheck(name, error, TOLERANCES[dtype])


def check_kv_write(block_size: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> KernelCheck:
    from engine.attention.ops.triton_kv_cache import write_kv_cache

    num_blocks, kv_heads = 8, 4
    cache = torch.zeros(2, kv_heads, num_blocks, block_size, head_dim, dtype=dtype, device=device)
    slots = torch.randperm(num_blocks * block_size)[:9].to(device)
    slots[3] = -1
    k, v = (_random(9, kv_heads, head_dim, dtype=dtype, device=device) for _ in range(2))
    write_kv_cache(k, v, cache, slots)
    expected = torch.zeros_like(cache)
    written = slots >= 0
    flat = expected.view(2, kv_heads, -1, head_dim)
    flat[0][:, slots[written]] = k[written].transpose(0, 1)
    flat[1][:, slots[written]] = v[written].transpose(0, 1)
    return KernelCheck(f"kv write block={block_size}", (cache - expected).abs().max().item(), 0.0)


def check_fused_layers(hidden: int, dtype: torch.dtype, device: torch.device) -> list[KernelCheck]:
    from engine.layers.activation import SiluAndMul
    from engine.layers.layernorm import RMSNorm
    from engine.layers.triton_fused import add_rms_norm, silu_and_mul

    norm = RMSNorm(hidden, 1e-5, dtype).to(device)
    norm.weight.data = _random(hidden, dtype=dtype, device=device)
    x, residual = (_random(7, hidden, dtype=dtype, device=device) for _ in range(2))
    got, got_sum = add_rms_norm(x, norm.weight, 1e-5, residual)
    want, want_sum = norm(x, residual)
    norm_error = max((got - want).abs().max().item(), (got_sum - want_sum).abs().max().item())
    gate_up = _random(7, 6 * hidden, dtype=dtype, device=device)
    silu_error = (silu_and_mul(gate_up).float() - SiluAndMul()(gate_up).float()).abs().max().item()
    tolerance = TOLERANCES[dtype] * 4  # outputs scale with |weight| and |up|, a few units here
    return [
        KernelCheck(f"add+rmsnorm hidden={hidden}", norm_error, tolerance),
        KernelCheck(f"silu*mul width={3 * hidden}", silu_error, tolerance),
    ]


def run_kernel_checks(
    device: torch.device,
    dtype: torch.dtype,
    length: int = 1024,
    head_dim: int = 128,
    groups: tuple[int, ...] = (1, 4, 8),
    block_sizes: tuple[int, ...] = (16, 32),
) -> list[KernelCheck]:
    """Every case; `length` is the longest decode context (prefill chunks scale with it)."""
    torch.manual_seed(0)
    checks: list[KernelCheck] = []
    short = max(length // 8, 3)
    for block_size in block_sizes:
        checks.append(check_kv_write(block_size, head_dim, dtype, device))
        for group in groups:
            lens = [1, block_size, block_size + 1, 2 * block_size + 1, short, length]
            for partition_size in (32, 32 * -(-max(lens) // 32)):  # split-K into 32-token partitions, then one pass
                checks.append(check_decode(group, block_size, partition_size, lens, head_dim, dtype, device))
            shapes = [(0, short), (block_size, short + 1), (length - short, 1), (3, 2 * block_size)]
            checks.append(check_prefill(group, block_size, shapes, head_dim, dtype, device))
    checks += check_fused_layers(8 * head_dim, dtype, device)
    return checks
