"""The cpu attention backend (the torch backend with the C++ decode kernel) against the torch backend: a mixed
step, several decode steps, the forced fallback when the kernel cannot be built, and the knob's checks."""

from __future__ import annotations

import pytest
import torch

from engine.attention import get_attention_backend, resolve_attention_backend
from engine.attention.cpu_backend import CpuAttentionBackend, CpuAttentionMetadata
from engine.attention.ops import cpu_paged_attention as ops
from engine.attention.torch_backend import TorchAttentionBackend
from engine.config import ConfigError, ModelConfig

HEADS, KV_HEADS, DIM, NUM_BLOCKS, BLOCK_SIZE = 6, 2, 16, 40, 16


def run_step(backend, cache, seqs, starts, ends):  # type: ignore[no-untyped-def]
    """Tokens [start, end) of every sequence as one flat batch through `backend`."""
    bs = backend.block_size
    q, k, v, slots, tables = [], [], [], [], []
    for seq, start, end in zip(seqs, starts, ends, strict=True):
        q.append(seq["q"][start:end])
        k.append(seq["k"][start:end])
        v.append(seq["v"][start:end])
        slots += [seq["blocks"][p // bs] * bs + p % bs for p in range(start, end)]
        tables.append(seq["blocks"])
    query_lens = [e - s for s, e in zip(starts, ends, strict=True)]
    metadata = backend.build_metadata(query_lens, list(ends), tables, torch.tensor(slots), torch.device("cpu"))
    return backend.forward(torch.cat(q), torch.cat(k), torch.cat(v), cache, metadata), metadata


def make_seqs(shapes, cache_dtype):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    free = torch.randperm(NUM_BLOCKS).tolist()  # block tables out of order
    return [
        {
            "q": torch.randn(context + new, HEADS, DIM),
            "k": torch.randn(context + new, KV_HEADS, DIM).to(cache_dtype).float(),
            "v": torch.randn(context + new, KV_HEADS, DIM).to(cache_dtype).float(),
            "blocks": [free.pop() for _ in range(-(-(context + new) // BLOCK_SIZE))],
        }
        for context, new in shapes
    ]


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_a_mixed_step_matches_the_torch_backend(cache_dtype: torch.dtype) -> None:
    """A fresh prefill, decodes between and after prefill chunks (scattered rows), a chunk with context and a
    verification-shaped chunk; the caches both backends wrote must be equal too."""
    cpu, reference = (
        CpuAttentionBackend(HEADS, KV_HEADS, DIM, 0.25, BLOCK_SIZE),
        TorchAttentionBackend(HEADS, KV_HEADS, DIM, 0.25, BLOCK_SIZE),
    )
    assert cpu.kernel is not None
    shapes = [(0, 21), (40, 1), (BLOCK_SIZE, 5), (7, 4), (3, 1), (70, 1), (15, 1)]  # (context, new tokens)
    seqs = make_seqs(shapes, cache_dtype)
    outputs, caches, metadatas = [], [], []
    for backend in (cpu, reference):
        cache = torch.zeros(backend.kv_cache_shape(NUM_BLOCKS), dtype=cache_dtype)
        warm = [i for i, (context, _) in enumerate(shapes) if context]
        run_step(backend, cache, [seqs[i] for i in warm], [0] * len(warm), [shapes[i][0] for i in warm])
        out, metadata = run_step(backend, cache, seqs, [c for c, _ in shapes], [c + n for c, n in shapes])
        outputs.append(out)
        caches.append(cache)
        metadatas.append(metadata)
    assert isinstance(metadatas[0], CpuAttentionMetadata) and metadatas[0].num_decodes == 4
    assert metadatas[0].decode_block_ids is None and len(metadatas[0].prefills) == 3  # decodes on the kernel
    torch.testing.assert_close(outputs[0], outputs[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(caches[0], caches[1])


def test_decode_steps_across_a_block_boundary_match_the_torch_backend() -> None:
    """Eight decode steps of three sequences (one crossing from 14 to 22 tokens over the 16-token boundary)."""
    shapes = [(14, 8), (30, 8), (5, 8)]
    seqs = make_seqs(shapes, torch.float32)
    cpu, reference = (
        CpuAttentionBackend(HEADS, KV_HEADS, DIM, 0.25, BLOCK_SIZE),
        TorchAttentionBackend(HEADS, KV_HEADS, DIM, 0.25, BLOCK_SIZE),
    )
    caches = [torch.zeros(b.kv_cache_shape(NUM_BLOCKS)) for b in (cpu, reference)]
    for backend, cache in zip((cpu, reference), caches, strict=True):
        run_step(backend, cache, seqs, [0] * 3, [c for c, _ in shapes])
    for step in range(8):
        starts = [c + step for c, _ in shapes]
        (ours, metadata), (theirs, _) = (
            run_step(b, cache, seqs, starts, [s + 1 for s in starts])
            for b, cache in zip((cpu, reference), caches, strict=True)
        )
        assert isinstance(metadata, CpuAttentionMetadata) and metadata.decode_block_ids is None  # no gather
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_decodes_without_a_cache_are_rejected() -> None:
    backend = CpuAttentionBackend(2, 1, 16, 1.0, 16)
    metadata = backend.build_metadata([1], [5], [[0]], torch.tensor([4]), torch.device("cpu"))
    with pytest.raises(ValueError, match="need a KV cache"):
        backend.forward(torch.zeros(1, 2, 16), torch.zeros(1, 1, 16), torch.zeros(1, 1, 16), None, metadata)


def test_a_failed_build_falls_back_to_the_torch_decode_path(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The kernel forced unavailable: `auto` picks torch, and `cpu` is the torch backend (gather, mirror)."""

    def broken() -> None:
        raise OSError("cannot open shared object file")

    monkeypatch.setattr(ops, "_build", broken)
    ops.reset_for_tests()
    try:
        assert resolve_attention_backend("auto", "cpu") == "torch"
        backend = CpuAttentionBackend(HEADS, KV_HEADS, DIM, 0.25, BLOCK_SIZE)
        assert backend.kernel is None
        shapes = [(40, 1), (0, 9), (17, 1)]
        seqs = make_seqs(shapes, torch.float32)
        reference = TorchAttentionBackend(HEADS, KV_HEADS, DIM, 0.25, BLOCK_SIZE)
        outputs = []
        for b in (backend, reference):
            cache = torch.zeros(b.kv_cache_shape(NUM_BLOCKS))
            run_step(b, cache, [seqs[0], seqs[2]], [0, 0], [40, 17])
            out, metadata = run_step(b, cache, seqs, [c for c, _ in shapes], [c + n for c, n in shapes])
            outputs.append(out)
            assert metadata.decode_block_ids is not None  # the torch path's gather index
        torch.testing.assert_close(outputs[0], outputs[1], atol=0, rtol=0)
    finally:
        ops.reset_for_tests()


def test_backend_name_auto_resolution_and_device_check() -> None:
    assert get_attention_backend("cpu") is CpuAttentionBackend
    assert resolve_attention_backend("auto", "cpu") == "cpu"  # the kernel builds here
    assert resolve_attention_backend("cpu", "cpu") == "cpu"
    with pytest.raises(ConfigError, match="attention_backend='cpu' runs on the CPU only"):
        ModelConfig(attention_backend="cpu", device="cuda")
    assert ModelConfig(attention_backend="cpu", device="cpu").attention_backend == "cpu"
