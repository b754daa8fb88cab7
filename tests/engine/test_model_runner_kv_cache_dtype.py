"""kv_cache_dtype in the model runner: a bfloat16 KV cache of a float32 model holds twice the blocks of the same
budget, and the engine's greedy output and logits on tiny-random stay close to the float32 cache's."""

from __future__ import annotations

import logging

import pytest
import torch

from engine import LLM, SamplingParams
from engine.config import EngineConfig
from engine.model_runner import ModelRunner

BUDGET = 3 * 2**20  # bytes: below the cap of max_num_seqs sequences, so the budget decides the block count


def sized_runner(kv_cache_dtype: str) -> ModelRunner:
    config = EngineConfig.from_kwargs(
        model="tiny-random", max_model_len=256, kv_cache_dtype=kv_cache_dtype, kv_cache_memory_bytes=BUDGET
    )
    return ModelRunner(config)


def test_bfloat16_kv_doubles_the_blocks_of_a_float32_model(caplog: pytest.LogCaptureFixture) -> None:
    auto, bf16 = sized_runner("auto"), sized_runner("bfloat16")
    assert auto.dtype == bf16.dtype == torch.float32
    assert (auto.kv_cache_dtype, bf16.kv_cache_dtype) == (torch.float32, torch.bfloat16)
    assert auto.block_bytes == 2 * bf16.block_bytes
    with caplog.at_level(logging.INFO, logger="engine.model_runner"):
        auto_blocks, bf16_blocks = auto.determine_num_blocks(), bf16.determine_num_blocks()
    assert auto_blocks == BUDGET // auto.block_bytes and bf16_blocks == 2 * auto_blocks
    assert f"KV cache: {bf16_blocks} blocks of 16 tokens" in caplog.text and "bfloat16, cpu" in caplog.text
    bf16.initialize_kv_cache(bf16_blocks)
    assert all(cache.dtype == torch.bfloat16 for cache in bf16.kv_caches)


def test_bfloat16_kv_greedy_output_and_logprobs_stay_close_to_float32() -> None:
    """Measured on tiny-random: every greedy token agrees and prompt logprobs differ by < 0.05 (bf16 rounding of K/V);
    assert all tokens but one agree, to leave room for a near tie."""
    prompts = [{"prompt_token_ids": [1] + [(7 * i + 3 * j) % 500 + 3 for j in range(20 + 9 * i)]} for i in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, prompt_logprobs=0)
    results = {}
    for kv_cache_dtype in ("auto", "bfloat16"):
        llm = LLM("tiny-random", max_model_len=128, block_size=8, kv_cache_dtype=kv_cache_dtype)
        results[kv_cache_dtype] = llm.generate(prompts, params, use_tqdm=False)
    tokens = {name: [t for o in out for t in o.outputs[0].token_ids] for name, out in results.items()}
    assert sum(a != b for a, b in zip(tokens["auto"], tokens["bfloat16"], strict=True)) <= 1
    for ref, run in zip(results["auto"], results["bfloat16"], strict=True):
        assert ref.prompt_logprobs is not None and run.prompt_logprobs is not None
        for token, a, b in zip(ref.prompt_token_ids[1:], ref.prompt_logprobs[1:], run.prompt_logprobs[1:], strict=True):
            assert abs(a[token].logprob - b[token].logprob) < 0.05
