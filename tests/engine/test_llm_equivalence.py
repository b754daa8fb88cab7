"""Engine greedy output == HF transformers `generate`, token for token, in float32.

Both sides take the plain argmax: HF with no EOS id (it neither stops nor masks), the engine with
ignore_eos. Checked for prompts submitted together and staggered, with prefix caching on (real hits)
and off, with chunked prefill forced to 32-token steps, and with a KV pool small enough to preempt; each with
the torch attention backend and with the cpu one (the C++ decode kernel, which `auto` picks on the CPU).

The SmolLM2 reference loads the checkpoint our loader converted from the GGUF; that those weights are
bit-identical to transformers' own GGUF loading is tests/engine/models/test_llama.py's job.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine import LLM, SamplingParams
from engine.model_files import resolve_model
from engine.tokenizer import get_tokenizer

SHARED_PREFIX = (
    "You are a careful assistant. Read the following note about the history of paged memory in operating "
    "systems and answer briefly. Note: virtual memory maps pages to frames through a page table."
)
TEXTS = [
    SHARED_PREFIX + " Question: what is a page?",
    SHARED_PREFIX + " Question: who invented it?",
    SHARED_PREFIX + " Question: why do frames help?",
    SHARED_PREFIX + " Question: name one drawback.",
    "Hi",
    "The capital of France is",
    "Écris une phrase courte sur les chats et les chiens, s'il te plaît, en français.",
    "List five prime numbers, explain why each is prime, and then describe the sieve of Eratosthenes "
    "step by step for a reader who has never seen it before, with a worked example up to thirty.",
]
MODELS = [pytest.param(("tiny-random", 24, backend), id=f"tiny-random-{backend}") for backend in ("torch", "cpu")] + [
    pytest.param(("smollm2-135m", 16, backend), id=f"smollm2-135m-{backend}", marks=pytest.mark.slow)
    for backend in ("torch", "cpu")
]


@dataclass
class Reference:
    model: str
    max_tokens: int
    prompts: list[list[int]]
    expected: list[list[int]]
    attention_backend: str
    default_knobs: dict[str, object] = field(default_factory=dict)  # under every engine's own knobs
    _llms: dict[tuple, LLM] = field(default_factory=dict)

    def llm(self, **knobs: object) -> LLM:
        """One engine per knob set, reused across tests (loading is the slow part)."""
        knobs = {**self.default_knobs, **knobs}
        key = tuple(sorted(knobs.items()))
        if key not in self._llms:
            self._llms[key] = LLM(
                self.model, dtype="float32", max_model_len=512, attention_backend=self.attention_backend, **knobs
            )
        return self._llms[key]

    @property
    def params(self) -> SamplingParams:
        return SamplingParams(temperature=0.0, max_tokens=self.max_tokens, ignore_eos=True)


@functools.cache
def hf_greedy(model_name: str, max_tokens: int) -> tuple[list[list[int]], list[list[int]]]:
    """The prompts' ids and HF's greedy continuations (computed once per model, shared by both backends)."""
    tokenizer = get_tokenizer(model_name)
    prompts = [tokenizer.encode(text) for text in TEXTS]
    hf = AutoModelForCausalLM.from_pretrained(resolve_model(model_name), dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None
    expected = []
    with torch.inference_mode():
        for ids in prompts:
            input_ids = torch.tensor([ids])
            out = hf.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=0,
            )
            expected.append(out[0, len(ids) :].tolist())
            assert len(expected[-1]) == max_tokens
    del hf
    return prompts, expected


@pytest.fixture(scope="module", params=MODELS)
def reference(request: pytest.FixtureRequest) -> Reference:
    return build_reference(*request.param)


def build_reference(model_name: str, max_tokens: int, attention_backend: str = "auto", **knobs: object) -> Reference:
    """HF's greedy continuations of TEXTS, `max_tokens` each, for engines on `attention_backend` (with `knobs`
    under each engine's own) to match."""
    prompts, expected = hf_greedy(model_name, max_tokens)
    return Reference(model_name, max_tokens, prompts, expected, attention_backend, dict(knobs))


def generate(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params, use_tqdm=False)
    return [out.outputs[0].token_ids for out in outputs]


def assert_same(got: list[list[int]], expected: list[list[int]]) -> None:
    for index, (ours, theirs) in enumerate(zip(got, expected, strict=True)):
        assert ours == theirs, f"prompt {index}: engine {ours} != HF {theirs}"


def stats_delta(llm: LLM, run: Callable[[], list[list[int]]]) -> tuple[list[list[int]], dict[str, int]]:
    before = llm.llm_engine.get_stats()
    result = run()
    after = llm.llm_engine.get_stats()
    names = ("prefix_cache_hits", "num_preemptions", "num_generation_tokens")
    return result, {name: getattr(after, name) - getattr(before, name) for name in names}


def test_the_engine_runs_the_named_backend(reference: Reference) -> None:
    runner = reference.llm().llm_engine.engine_core.model_executor
    assert runner.attention_backend == reference.attention_backend
    if reference.attention_backend == "cpu":
        assert runner.attn_backend.kernel is not None  # the C++ kernel, not the torch fallback


def test_prompts_have_different_lengths(reference: Reference) -> None:
    lengths = [len(p) for p in reference.prompts]
    assert len(set(lengths)) >= 6 and min(lengths) <= 3 and max(lengths) > 32


def test_submitted_together(reference: Reference) -> None:
    assert_same(generate(reference.llm(), reference.prompts, reference.params), reference.expected)


def test_staggered_while_others_run(reference: Reference) -> None:
    engine = reference.llm().llm_engine
    got: dict[str, list[int]] = {}
    pending = list(enumerate(reference.prompts))
    step = 0
    while pending or engine.has_unfinished_requests():
        if pending and step % 3 == 0:  # two new requests every third step, joining running ones
            for index, ids in pending[:2]:
                engine.add_request(f"stagger-{index}", ids, reference.params)
            pending = pending[2:]
        for output in engine.step():
            if output.finished:
                got[output.request_id] = output.outputs[0].token_ids
        step += 1
    assert_same([got[f"stagger-{i}"] for i in range(len(reference.prompts))], reference.expected)


@pytest.mark.parametrize("enable_prefix_caching", [True, False])
def test_prefix_caching_on_and_off(reference: Reference, enable_prefix_caching: bool) -> None:
    llm = reference.llm(enable_prefix_caching=enable_prefix_caching)
    assert llm.reset_prefix_cache()
    first = generate(llm, reference.prompts[:1], reference.params)
    rest, delta = stats_delta(llm, lambda: generate(llm, reference.prompts[1:], reference.params))
    assert_same(first + rest, reference.expected)
    if enable_prefix_caching:
        assert delta["prefix_cache_hits"] >= 3 * 16  # prompts 1-3 reuse prompt 0's cached prefix blocks
    else:
        assert delta["prefix_cache_hits"] == 0


def test_chunked_prefill_with_a_32_token_budget(reference: Reference) -> None:
    llm = reference.llm(max_num_batched_tokens=32, enable_chunked_prefill=True)
    assert_same(generate(llm, reference.prompts, reference.params), reference.expected)


def test_preemption_in_a_tiny_kv_pool(reference: Reference) -> None:
    block_size = 16
    longest = max(len(p) for p in reference.prompts) + reference.max_tokens
    num_blocks = -(-longest // block_size) + 2  # room for the longest request, far from all of them at once
    llm = reference.llm(num_gpu_blocks_override=num_blocks, block_size=block_size)
    got, delta = stats_delta(llm, lambda: generate(llm, reference.prompts, reference.params))
    assert delta["num_preemptions"] > 0
    assert_same(got, reference.expected)
