"""A draft model's KV blocks come out of the target's memory budget: the pool shrinks so that the target's and the
draft's caches together stay within it, and greedy output is unchanged."""

from __future__ import annotations

import pytest
import torch
from spec_decode_models import SMALL_VOCAB_CONFIG, SmallVocabModels

from engine import LLM, SamplingParams
from engine.model_files import random_state_dict, write_hf_checkpoint
from engine.model_runner import KVCacheBudget, ModelRunner

PROMPTS = [[1] + [(i * 5 + j) % 13 + 3 for j in range(4 + 3 * i)] for i in range(3)]
PARAMS = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
KNOBS = {"dtype": "float32", "max_model_len": 32, "block_size": 4}  # 8 blocks hold one sequence


def budget_of(num_bytes: int) -> KVCacheBudget:
    return KVCacheBudget(num_bytes, "the test's budget")


def kv_bytes(runner: ModelRunner) -> int:
    return sum(cache.nbytes for cache in runner.kv_caches)


def generate(llm: LLM) -> list[list[int]]:
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], PARAMS, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outputs]


@pytest.fixture(scope="module")
def one_layer_draft(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A draft with half the target's layers, so its KV block costs a different number of bytes."""
    config = {**SMALL_VOCAB_CONFIG, "num_hidden_layers": 1}
    path = tmp_path_factory.mktemp("draft-1-layer")
    write_hf_checkpoint(path, config, random_state_dict(config, seed=13), "tiny-random")
    return str(path)


def test_draft_kv_shares_the_target_budget_and_greedy_output_is_unchanged(
    small_vocab_models: SmallVocabModels, one_layer_draft: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The target's budget: 12 of its blocks and a half (the cap of max_num_seqs sequences never binds here).
    monkeypatch.setattr(
        ModelRunner, "kv_cache_budget", lambda self: budget_of(12 * self.block_bytes + self.block_bytes // 2)
    )
    plain = LLM(small_vocab_models.target, **KNOBS)
    assert plain.llm_engine.engine_core.num_gpu_blocks == 12
    reference = generate(plain)

    draft = {"method": "draft_model", "model": one_layer_draft, "num_speculative_tokens": 2}
    llm = LLM(small_vocab_models.target, speculative_config=draft, **KNOBS)
    core = llm.llm_engine.engine_core
    assert core.spec_decoder is not None and core.spec_decoder.draft_model is not None
    target, draft_runner = core.model_executor, core.spec_decoder.draft_model.runner
    assert isinstance(target, ModelRunner)
    budget = target.kv_cache_budget().bytes
    assert draft_runner.block_bytes * 2 == target.block_bytes  # one layer against two
    assert core.num_gpu_blocks == budget // (target.block_bytes + draft_runner.block_bytes) == 8
    assert draft_runner.num_blocks == core.num_gpu_blocks
    total = kv_bytes(target) + kv_bytes(draft_runner)
    assert total == core.num_gpu_blocks * (target.block_bytes + draft_runner.block_bytes) <= budget
    assert generate(llm) == reference
    assert llm.llm_engine.get_stats().num_preemptions > 0  # 8 blocks of 4 tokens do not hold every request
    ngram = LLM(small_vocab_models.target, speculative_config={"method": "ngram", "num_speculative_tokens": 2}, **KNOBS)
    assert ngram.llm_engine.engine_core.num_gpu_blocks == 12  # prompt lookup holds no KV of its own


def test_a_budget_the_draft_leaves_too_small_is_a_clear_error(
    small_vocab_models: SmallVocabModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ModelRunner, "kv_cache_budget", lambda self: budget_of(10 * self.block_bytes))
    LLM(small_vocab_models.target, **KNOBS)  # 10 blocks hold one 32-token sequence (8 blocks)
    draft = {"method": "draft_model", "model": small_vocab_models.draft, "num_speculative_tokens": 2}
    with pytest.raises(ValueError, match="draft KV"):  # half as many blocks with a same-size draft: 5 < 8
        LLM(small_vocab_models.target, speculative_config=draft, **KNOBS)


def test_the_draft_kv_cache_follows_kv_cache_dtype(small_vocab_models: SmallVocabModels) -> None:
    draft = {"method": "draft_model", "model": small_vocab_models.target, "num_speculative_tokens": 2}
    llm = LLM(small_vocab_models.target, speculative_config=draft, kv_cache_dtype="bfloat16", **KNOBS)
    core = llm.llm_engine.engine_core
    assert core.spec_decoder is not None and core.spec_decoder.draft_model is not None
    target, draft_runner = core.model_executor, core.spec_decoder.draft_model.runner
    assert isinstance(target, ModelRunner)
    assert target.kv_cache_dtype == draft_runner.kv_cache_dtype == torch.bfloat16
    assert all(cache.dtype == torch.bfloat16 for cache in target.kv_caches + draft_runner.kv_caches)
    assert len(generate(llm)[0]) == PARAMS.max_tokens
