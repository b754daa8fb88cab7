"""The torch backend over a bfloat16 KV cache with float32 q/k/v: the write rounds K/V to bfloat16, and decodes
(gathered or through the mirror) and chunks with context equal a dense reference over the rounded K/V."""

from __future__ import annotations

import pytest
import torch
from test_torch_backend import dense_reference, random_sequence, run_step

from engine.attention import TorchAttentionBackend


def test_the_kv_write_rounds_to_the_cache_dtype_and_reads_back() -> None:
    torch.manual_seed(0)
    backend = TorchAttentionBackend(4, 2, 8, 0.35, 4)
    cache = torch.zeros(backend.kv_cache_shape(6), dtype=torch.bfloat16)
    seq = random_sequence(7, 4, 2, 8, [5, 2])
    run_step(backend, cache, [seq], [0], [7])
    stored = cache.view(2, 2, -1, 8)
    slots = [5 * 4 + p for p in range(4)] + [2 * 4 + p for p in range(3)]
    torch.testing.assert_close(stored[0][:, slots].transpose(0, 1), seq["k"].to(torch.bfloat16), atol=0, rtol=0)
    torch.testing.assert_close(stored[1][:, slots].transpose(0, 1), seq["v"].to(torch.bfloat16), atol=0, rtol=0)
    key, value = backend._gather(cache, torch.tensor([5, 2]), torch.float32)
    assert key.dtype == value.dtype == torch.float32
    torch.testing.assert_close(key[:, :7].transpose(0, 1), seq["k"].to(torch.bfloat16).float(), atol=0, rtol=0)


@pytest.mark.parametrize("mirror_budget", [32 * 2**20, 0])
def test_decodes_and_context_chunks_read_the_rounded_kv(mirror_budget: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("engine.attention.torch_backend.MIRROR_BYTES_PER_LAYER", mirror_budget)
    torch.manual_seed(1)
    block_size, heads, kv_heads, dim, scale = 4, 4, 2, 8, 0.35
    backend = TorchAttentionBackend(heads, kv_heads, dim, scale, block_size)
    cache = torch.zeros(backend.kv_cache_shape(64), dtype=torch.bfloat16)
    free = torch.randperm(64).tolist()
    prompts, steps = [5, 9], 6
    seqs = [random_sequence(n + steps + 3, heads, kv_heads, dim, [free.pop() for _ in range(6)]) for n in prompts]
    rounded = [{"k": s["k"].to(torch.bfloat16).float(), "v": s["v"].to(torch.bfloat16).float()} for s in seqs]
    run_step(backend, cache, seqs, [0, 0], prompts)
    for step in range(steps):
        starts = [n + step for n in prompts]
        out = run_step(backend, cache, seqs, starts, [s + 1 for s in starts])
        for row, (i, start) in enumerate(zip(range(2), starts, strict=True)):
            k, v = rounded[i]["k"][: start + 1], rounded[i]["v"][: start + 1]
            expected = dense_reference(seqs[i]["q"][start : start + 1], k, v, start, scale)
            torch.testing.assert_close(out[row : row + 1], expected, atol=1e-5, rtol=1e-5)
    start = prompts[0] + steps  # a 3-token chunk with context: its own K/V are read back from the cache too
    out = run_step(backend, cache, seqs[:1], [start], [start + 3])
    k, v = rounded[0]["k"][: start + 3], rounded[0]["v"][: start + 3]
    expected = dense_reference(seqs[0]["q"][start : start + 3], k, v, start, scale)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
