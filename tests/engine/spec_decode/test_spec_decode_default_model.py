"""On the default model (SmolLM2-135M), a short run: greedy output with speculation is token-identical to without,
for prompt lookup and for a draft model (tiny-random shares its tokenizer), with prefix caching, chunked prefill
and preemption on."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from workloads.copy_heavy import copy_heavy

KNOBS = {"dtype": "float32", "max_model_len": 512, "block_size": 16, "max_num_batched_tokens": 64,
         "num_gpu_blocks_override": 16, "enable_prefix_caching": True}  # fmt: skip
PARAMS = SamplingParams(temperature=0.0, max_tokens=24)


@pytest.fixture(scope="module")
def prompts_and_reference() -> tuple[list[list[int]], list[list[int]]]:
    llm = LLM("smollm2-135m", **KNOBS)
    tokenizer = llm.get_tokenizer()
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": r.prompt}], add_generation_prompt=True)
        for r in copy_heavy(4, seed=1, sentences=(3, 4))
    ]
    prompts = [list(p["input_ids"] if hasattr(p, "keys") else p) for p in prompts]
    return prompts, generate(llm, prompts)


def generate(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], PARAMS, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outputs]


@pytest.mark.slow
@pytest.mark.parametrize(
    "config",
    [
        {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2, "prompt_lookup_max": 4},
        {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2, "prompt_lookup_max": 4},
        {"method": "draft_model", "model": "tiny-random", "num_speculative_tokens": 3},
    ],
    ids=["ngram-2", "ngram-5", "draft-3"],
)
def test_greedy_output_is_unchanged(config: dict, prompts_and_reference: tuple) -> None:
    prompts, reference = prompts_and_reference
    llm = LLM("smollm2-135m", speculative_config=config, **KNOBS)
    assert generate(llm, prompts) == reference
    stats = llm.llm_engine.get_stats()
    assert stats.num_preemptions > 0 and stats.spec_decoding_stats is not None
    assert stats.spec_decoding_stats.num_draft_tokens > 0
    if config["method"] == "ngram":
        assert stats.spec_decoding_stats.num_accepted_tokens > 0  # the model copies its prompt
