"""Speculative decoding in the engine: greedy output token-identical to no speculation (K = 1..5, both proposers,
prefix caching, chunked prefill and preemption on; the reference on the torch attention backend, speculation on
`auto`, which is the cpu backend's C++ decode kernel on the CPU), sampled output with the target's distribution,
reproducible seeds, and clean KV accounting after rejections, aborts and preemptions."""

from __future__ import annotations

import json

import pytest
import torch
from spec_decode_models import SmallVocabModels

from engine import LLM, SamplingParams
from engine.block_pool import hash_full_blocks
from engine.config import EngineConfig
from engine.engine_core import EngineCore
from engine.request import Request

PROMPTS = [[1] + [(i * 7 + j) % 13 + 3 for j in range(5 + 3 * i)] for i in range(6)]
MAX_TOKENS = 16
# A 32-token budget chunks the longer prompts; 24 blocks of 4 tokens cannot hold every request at once.
TIGHT = {"block_size": 4, "max_num_batched_tokens": 32, "num_gpu_blocks_override": 24, "enable_prefix_caching": True}


def spec_config(method: str, k: int, models: SmallVocabModels) -> dict:
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    return {"method": "draft_model", "model": models.draft, "num_speculative_tokens": k}


def generate(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outputs]


@pytest.fixture(scope="module")
def greedy_reference(small_vocab_models: SmallVocabModels) -> list[list[int]]:
    llm = LLM(small_vocab_models.target, dtype="float32", max_model_len=128, block_size=4, attention_backend="torch")
    return generate(llm, PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True))


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_greedy_output_is_unchanged(
    method: str, k: int, small_vocab_models: SmallVocabModels, greedy_reference: list[list[int]]
) -> None:
    config = spec_config(method, k, small_vocab_models)
    llm = LLM(small_vocab_models.target, dtype="float32", max_model_len=128, speculative_config=config, **TIGHT)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    assert generate(llm, PROMPTS, params) == greedy_reference
    stats = llm.llm_engine.get_stats()
    spec = stats.spec_decoding_stats
    assert spec is not None and stats.num_preemptions > 0
    assert 0 < spec.num_accepted_tokens < spec.num_draft_tokens  # drafts were verified, some kept, some rejected
    assert len(spec.num_accepted_tokens_per_pos) == k
    assert sum(spec.num_accepted_tokens_per_pos) == spec.num_accepted_tokens
    if method == "draft_model":
        proposer = llm.llm_engine.engine_core.spec_decoder.draft_model  # type: ignore[union-attr]
        assert proposer.num_free_blocks == proposer.kv_cache_manager.num_blocks


def two_sample_p_value(a: torch.Tensor, b: torch.Tensor, num_cells: int) -> float:
    """Chi-square test of homogeneity of two samples of token ids."""
    table = torch.stack([torch.bincount(a, minlength=num_cells), torch.bincount(b, minlength=num_cells)]).double()
    table = table[:, table.sum(0) > 0]
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
    statistic = ((table - expected) ** 2 / expected).sum()
    df = table.shape[1] - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), statistic / 2))


def sample_core(core: EngineCore, prompt: list[int], params: SamplingParams, num_requests: int) -> torch.Tensor:
    requests = [Request(f"s{i}", list(prompt), params, eos_token_id=2, max_tokens=params.max_tokens or 1)
                for i in range(num_requests)]  # fmt: skip
    for request in requests:
        core.add_request(request)
    while core.has_unfinished_requests():
        core.step()
    return torch.tensor([r.output_token_ids for r in requests])


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_sampled_output_has_the_targets_distribution(method: str, small_vocab_models: SmallVocabModels) -> None:
    prompt = [1, *range(3, 16), 5, 9]  # every token occurs, so prompt lookup always has drafts
    params = SamplingParams(temperature=0.8, top_k=8, presence_penalty=0.5, max_tokens=3, ignore_eos=True)
    samples = []
    for config in (None, json.dumps(spec_config(method, 2, small_vocab_models))):
        core = EngineCore(EngineConfig.from_kwargs(model=small_vocab_models.target, dtype="float32", max_model_len=32,
                                                   speculative_config=config, seed=3))  # fmt: skip
        samples.append(sample_core(core, prompt, params, 600))
    spec = core.get_stats().spec_decoding_stats
    assert spec is not None and 0 < spec.num_accepted_tokens < spec.num_draft_tokens
    for position in (1, 2):  # token 0 comes from the prefill; later ones went through verification
        p_value = two_sample_p_value(samples[0][:, position], samples[1][:, position], 16)
        assert p_value > 1e-3, (position, p_value)


def test_seeded_requests_repeat_with_drafts(small_vocab_models: SmallVocabModels) -> None:
    config = spec_config("draft_model", 3, small_vocab_models)
    llm = LLM(small_vocab_models.target, dtype="float32", max_model_len=64, speculative_config=config)
    params = SamplingParams(temperature=1.0, seed=5, max_tokens=12, ignore_eos=True)
    first = generate(llm, PROMPTS[:3], params)
    assert generate(llm, PROMPTS[:3][::-1], params)[::-1] == first  # other batch order, same tokens


def test_kv_blocks_are_all_free_and_no_rejected_draft_is_cached(small_vocab_models: SmallVocabModels) -> None:
    config = json.dumps(spec_config("draft_model", 4, small_vocab_models))
    core = EngineCore(EngineConfig.from_kwargs(model=small_vocab_models.target, dtype="float32", max_model_len=128,
                                               speculative_config=config, **TIGHT))  # fmt: skip
    requests = []
    for i, prompt in enumerate(PROMPTS * 2):
        params = SamplingParams(temperature=0.0 if i % 2 else 1.0, max_tokens=MAX_TOKENS, ignore_eos=True)
        requests.append(Request(f"r{i}", list(prompt), params, eos_token_id=2, max_tokens=MAX_TOKENS))
        core.add_request(requests[-1])
    steps = 0
    while core.has_unfinished_requests():
        core.step()
        steps += 1
        if steps == 6:
            core.abort_requests(["r1", "r4", "r7"])
    stats = core.get_stats()
    assert stats.num_preemptions > 0 and stats.spec_decoding_stats is not None
    assert stats.spec_decoding_stats.num_accepted_tokens < stats.spec_decoding_stats.num_draft_tokens
    manager = core.scheduler.kv_cache_manager
    assert manager.num_free_blocks() == manager.num_blocks
    draft = core.spec_decoder.draft_model  # type: ignore[union-attr]
    assert draft.num_free_blocks == draft.kv_cache_manager.num_blocks
    # Every cached block holds tokens some request really had (prompt + kept output), never a rejected draft.
    real = {h for r in requests for h in hash_full_blocks(r.all_token_ids, manager.block_size, None)}
    cached = set(manager.block_pool.cached_block_hash_to_block)
    assert cached and cached <= real


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_penalties_stop_ids_min_and_max_tokens_behave_as_without_speculation(
    method: str, small_vocab_models: SmallVocabModels
) -> None:
    params = [
        SamplingParams(temperature=0.0, repetition_penalty=1.3, frequency_penalty=0.4, max_tokens=14, ignore_eos=True),
        SamplingParams(temperature=0.0, stop_token_ids=[7, 9], min_tokens=3, max_tokens=20, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True),
    ]
    prompts = [{"prompt_token_ids": p} for p in PROMPTS[:3] for _ in params]  # every prompt with every params
    results = []
    for config in (None, spec_config(method, 4, small_vocab_models)):
        llm = LLM(small_vocab_models.target, dtype="float32", max_model_len=128, speculative_config=config)
        outputs = [o.outputs[0] for o in llm.generate(prompts, params * 3, use_tqdm=False)]
        results.append([(o.token_ids, o.finish_reason, o.stop_reason) for o in outputs])
    assert results[0] == results[1]
    assert any(stop in (7, 9) for _, _, stop in results[0])  # a stop id ended some request


def test_a_stop_string_inside_an_accepted_run_ends_the_request_there() -> None:
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    plain = LLM("tiny-random", dtype="float32", max_model_len=128)
    prompt = {"prompt_token_ids": list(range(1000, 1012))}
    text = plain.generate(prompt, params, use_tqdm=False)[0].outputs[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 4]
    stopped = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, stop=[stop])
    expected = plain.generate(prompt, stopped, use_tqdm=False)[0].outputs[0]
    # The target as its own draft: every draft is accepted, so the stop string lands inside a run of 5 tokens.
    config = {"method": "draft_model", "model": "tiny-random", "num_speculative_tokens": 4}
    spec = LLM("tiny-random", dtype="float32", max_model_len=128, speculative_config=config)
    got = spec.generate(prompt, stopped, use_tqdm=False)[0].outputs[0]
    assert (got.text, got.token_ids, got.stop_reason) == (expected.text, expected.token_ids, stop)
    stats = spec.llm_engine.get_stats().spec_decoding_stats
    assert stats is not None and stats.num_accepted_tokens == stats.num_draft_tokens > 0
    assert spec.llm_engine.engine_core.spec_decoder.draft_model.num_free_blocks == (  # type: ignore[union-attr]
        spec.llm_engine.engine_core.spec_decoder.draft_model.kv_cache_manager.num_blocks  # type: ignore[union-attr]
    )
