"""The Triton attention backend (interpreted on the CPU) against the torch backend: the same attention
outputs for a mixed step, and the same greedy tokens from the engine on tiny-random (with the fused Triton
norm and activation kernels that come with the backend)."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.attention import get_attention_backend, resolve_attention_backend
from engine.attention.triton_backend import TritonAttentionBackend
from engine.config import ATTENTION_BACKENDS, ConfigError, ModelConfig


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
    return backend.forward(torch.cat(q), torch.cat(k), torch.cat(v), cache, metadata)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_a_mixed_step_matches_the_torch_backend(cache_dtype: torch.dtype) -> None:
    """Prefills, chunks with context, a verification-shaped chunk and decodes (one split-K) in one batch,
    decodes placed after prefills; the caches both backends wrote must be equal too. A bfloat16 cache
    (kv_cache_dtype) under float32 q: K/V are bfloat16-representable here, because a chunk's own tokens are
    read back from the cache by the torch backend and taken fresh by the triton one."""
    torch.manual_seed(0)
    heads, kv_heads, dim, num_blocks, block_size = 6, 2, 16, 40, 16
    triton_backend = TritonAttentionBackend(heads, kv_heads, dim, 0.25, block_size)
    triton_backend.decode_partition_size = 32
    torch_backend = get_attention_backend("torch")(heads, kv_heads, dim, 0.25, block_size)
    shapes = [(0, 21), (40, 1), (block_size, 5), (7, 4), (3, 1), (70, 1)]  # (context, new tokens)
    free = torch.randperm(num_blocks).tolist()
    seqs = []
    for context, new in shapes:
        total = context + new
        seqs.append(
            {
                "q": torch.randn(total, heads, dim),
                "k": torch.randn(total, kv_heads, dim).to(cache_dtype).float(),
                "v": torch.randn(total, kv_heads, dim).to(cache_dtype).float(),
                "blocks": [free.pop() for _ in range(-(-total // block_size))],
            }
        )
    outputs, caches = [], []
    for backend in (triton_backend, torch_backend):
        cache = torch.zeros(backend.kv_cache_shape(num_blocks), dtype=cache_dtype)
        warm = [i for i, (context, _) in enumerate(shapes) if context]
        run_step(backend, cache, [seqs[i] for i in warm], [0] * len(warm), [shapes[i][0] for i in warm])
        outputs.append(run_step(backend, cache, seqs, [c for c, _ in shapes], [c + n for c, n in shapes]))
        caches.append(cache)
    torch.testing.assert_close(outputs[0], outputs[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(caches[0], caches[1])


def test_decodes_without_a_cache_are_rejected() -> None:
    backend = TritonAttentionBackend(2, 1, 16, 1.0, 16)
    metadata = backend.build_metadata([1], [5], [[0]], torch.tensor([4]), torch.device("cpu"))
    with pytest.raises(ValueError, match="need a KV cache"):
        backend.forward(torch.zeros(1, 2, 16), torch.zeros(1, 1, 16), torch.zeros(1, 1, 16), None, metadata)


def test_backend_names_and_auto_resolution() -> None:
    assert ATTENTION_BACKENDS == ("auto", "torch", "triton", "cpu")
    assert get_attention_backend("triton") is TritonAttentionBackend
    assert resolve_attention_backend("auto", "cuda") == "triton"
    assert resolve_attention_backend("triton", "cpu") == "triton"
    with pytest.raises(ValueError, match="unknown attention backend 'flash'"):
        get_attention_backend("flash")
    with pytest.raises(ConfigError, match="attention_backend must be one of"):
        ModelConfig(attention_backend="flash")


def test_engine_greedy_tokens_equal_the_torch_backend() -> None:
    """tiny-random, float32: prompts sharing a prefix (prefix-cache hits), chunked prefill at 32 tokens
    (chunks with context) and decoding, with one request arriving while the others decode; the triton and the
    cpu (C++ decode kernel) backends against torch."""
    prompts = [[(7 * i + 3) % 4000 + 10 for i in range(45)], [(7 * i + 3) % 4000 + 10 for i in range(37)] + [5, 9]]
    prompts += [[11, 12, 13], list(range(100, 117))]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    tokens = {}
    for name in ("torch", "triton", "cpu"):
        llm = LLM(
            "tiny-random", dtype="float32", device="cpu", max_model_len=128, max_num_batched_tokens=32,
            attention_backend=name,
        )  # fmt: skip
        runner = llm.llm_engine.engine_core.model_executor
        assert runner.attention_backend == name
        fused = runner.model.layers[0].mlp.act_fn.fused_kernel is not None
        assert fused == (name == "triton")  # the triton backend brings the fused norm and activation kernels
        engine = llm.llm_engine
        for index, ids in enumerate(prompts[:3]):
            engine.add_request(str(index), ids, params)
        got, step = {}, 0
        while engine.has_unfinished_requests():
            if step == 3:
                engine.add_request("3", prompts[3], params)
            for output in engine.step():
                if output.finished:
                    got[output.request_id] = output.outputs[0].token_ids
            step += 1
        assert engine.get_stats().prefix_cache_hits > 0
        tokens[name] = [got[str(i)] for i in range(len(prompts))]
    assert tokens["triton"] == tokens["torch"]
    assert tokens["cpu"] == tokens["torch"]
