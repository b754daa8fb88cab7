"""The HF greedy-equivalence checks of test_llm_equivalence.py, run with the compiled forward (torch.compile).

The suite runs every engine eagerly (tests/conftest.py sets SERVELAB_ENFORCE_EAGER=1: the compile costs seconds at
each engine start even with a warm cache); this module unsets it, so its engines compile (engine/models/compilation.py).
The first compile in the process pays the compiler (tens of seconds with a cold inductor cache, ~12 s warm on two busy
cores); every later engine here reuses the compiled graphs. Also here: each compiled region against its eager self at
several token counts, with no recompile after start-up.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from test_llm_equivalence import (
    Reference,
    assert_same,
    build_reference,
    generate,
    test_chunked_prefill_with_a_32_token_budget,
    test_preemption_in_a_tiny_kv_pool,
    test_prefix_caching_on_and_off,
    test_staggered_while_others_run,
    test_submitted_together,
)
from torch._dynamo.utils import counters

from engine.models.compilation import ENFORCE_EAGER_ENV, REGIONS, CompiledRegion

pytestmark = pytest.mark.slow

__all__ = [  # the reused checks, collected here again with compiled engines
    "test_chunked_prefill_with_a_32_token_budget",
    "test_preemption_in_a_tiny_kv_pool",
    "test_prefix_caching_on_and_off",
    "test_staggered_while_others_run",
    "test_submitted_together",
]


@pytest.fixture(scope="module", autouse=True)
def compiled_engines() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(ENFORCE_EAGER_ENV, raising=False)
        yield


@pytest.fixture(scope="module")
def reference() -> Reference:
    """tiny-random only: its compile is the cheap one (the layer graphs are the same code for every model)."""
    return build_reference("tiny-random", 24, enforce_eager=False)  # every engine here compiles


def test_the_engines_here_are_compiled(reference: Reference) -> None:
    forward_mode = reference.llm().llm_engine.engine_core.forward_mode
    assert forward_mode.startswith("compiled in "), forward_mode


def unique_graphs() -> int:
    return counters["stats"]["unique_graphs"]


@pytest.mark.parametrize(
    "speculative_config",
    [
        '{"method": "ngram", "num_speculative_tokens": 3}',
        '{"method": "draft_model", "model": "tiny-random", "num_speculative_tokens": 3}',
    ],
    ids=["ngram", "draft_model"],
)
def test_speculation(reference: Reference, speculative_config: str) -> None:
    llm = reference.llm(speculative_config=speculative_config)
    assert_same(generate(llm, reference.prompts, reference.params), reference.expected)
    stats = llm.llm_engine.get_stats().spec_decoding_stats
    assert stats is not None
    if "draft_model" in speculative_config:  # the draft compiles too; tiny-random's output gives ngram no drafts
        assert stats.num_draft_tokens > 0
        assert llm.llm_engine.engine_core.spec_decoder.draft_model.runner.forward_mode.startswith("compiled")


def test_tensor_parallel(reference: Reference) -> None:
    """Each rank's worker process compiles its own shard's forward (the all-reduce stays eager between regions)."""
    llm = reference.llm(tensor_parallel_size=2)
    assert llm.llm_engine.engine_core.forward_mode.startswith("compiled in ")  # rank 0's
    assert_same(generate(llm, reference.prompts, reference.params), reference.expected)


def test_enforce_eager(reference: Reference) -> None:
    llm = reference.llm(enforce_eager=True)
    assert llm.llm_engine.engine_core.forward_mode == "eager (--enforce-eager)"
    assert_same(generate(llm, reference.prompts, reference.params), reference.expected)


def test_no_recompile_after_start_up(reference: Reference) -> None:
    llm = reference.llm(max_num_batched_tokens=48, enable_chunked_prefill=True)
    before = unique_graphs()
    generate(llm, reference.prompts, reference.params)  # decode batches of 1-8, prefill chunks of many sizes
    assert unique_graphs() == before


@pytest.mark.parametrize("num_tokens", [1, 3, 8, 33])
def test_each_region_matches_its_eager_self(
    reference: Reference, num_tokens: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every region of the first two layers (the first has no incoming residual) on the inputs a forward of
    `num_tokens` tokens gives it, against the layer's own eager method; no token count compiles anything new."""
    runner = reference.llm().llm_engine.engine_core.model_executor
    calls: list[tuple[CompiledRegion, tuple]] = []
    for layer in runner.model.layers[:2]:
        for name in REGIONS:
            region = getattr(layer, name)
            assert isinstance(region, CompiledRegion)

            def spy(*args: object, region: CompiledRegion = region) -> object:
                calls.append((region, args))
                return region(*args)

            monkeypatch.setattr(layer, name, spy)
    before = unique_graphs()
    with torch.inference_mode():
        runner._dummy_forward([num_tokens])
        assert len(calls) == 4
        for region, args in calls:
            for got, want in zip(region(*args), region.eager(*args), strict=True):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert unique_graphs() == before, f"{num_tokens} tokens compiled a new graph after start-up"
