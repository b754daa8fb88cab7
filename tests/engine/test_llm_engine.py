"""LLMEngine / LLM on tiny-random: stop strings and ids, seeds across batches, logprobs, bad input, aborts."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("tiny-random", dtype="float32", max_model_len=128, num_gpu_blocks_override=64)


def test_generate_accepts_strings_and_token_ids_in_order(llm: LLM) -> None:
    token_ids = llm.get_tokenizer().encode("Once upon a time")
    outputs = llm.generate(["Once upon a time", {"prompt_token_ids": token_ids}, "Hi"], GREEDY, use_tqdm=False)
    assert [o.prompt for o in outputs] == ["Once upon a time", None, "Hi"]
    assert outputs[0].prompt_token_ids == token_ids == outputs[1].prompt_token_ids
    assert outputs[0].outputs[0].token_ids == outputs[1].outputs[0].token_ids
    for output in outputs:
        completion = output.outputs[0]
        assert len(completion.token_ids) == 12 and completion.finish_reason == "length"
        assert completion.text == llm.get_tokenizer().decode(completion.token_ids)
        assert output.finished and output.timing is not None and output.timing.finished_time is not None


def test_stop_string_ends_the_request_and_is_not_emitted(llm: LLM) -> None:
    (free,) = llm.generate("The weather today", GREEDY, use_tqdm=False)
    text = free.outputs[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip(), f"pick a visible stop string from {text!r}"
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, stop=[stop])
    (stopped,) = llm.generate("The weather today", params, use_tqdm=False)
    completion = stopped.outputs[0]
    assert completion.finish_reason == "stop" and completion.stop_reason == stop
    assert completion.text == text[: text.index(stop)]
    assert completion.token_ids == free.outputs[0].token_ids[: len(completion.token_ids)]
    assert len(completion.token_ids) < 12
    assert not llm.llm_engine.has_unfinished_requests()
    assert llm.llm_engine.get_stats().kv_cache_usage == 0.0


def test_stop_token_id_reports_the_id(llm: LLM) -> None:
    (free,) = llm.generate("Numbers:", GREEDY, use_tqdm=False)
    stop_id = free.outputs[0].token_ids[3]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, stop_token_ids=[stop_id])
    (stopped,) = llm.generate("Numbers:", params, use_tqdm=False)
    first = free.outputs[0].token_ids.index(stop_id)
    assert stopped.outputs[0].token_ids == free.outputs[0].token_ids[: first + 1]
    assert (stopped.outputs[0].finish_reason, stopped.outputs[0].stop_reason) == ("stop", stop_id)


def test_seeded_sampling_does_not_depend_on_batch_mates(llm: LLM) -> None:
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=42, max_tokens=10, ignore_eos=True)
    (alone,) = llm.generate("A seeded story", seeded, use_tqdm=False)
    mates = SamplingParams(temperature=1.2, max_tokens=14, ignore_eos=True)
    crowded = llm.generate(["First mate", "A seeded story", "Second mate here"], [mates, seeded, mates], use_tqdm=False)
    assert crowded[1].outputs[0].token_ids == alone.outputs[0].token_ids


def test_logprobs_per_token(llm: LLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=3)
    (output,) = llm.generate("Logprobs please", params, use_tqdm=False)
    completion = output.outputs[0]
    assert completion.logprobs is not None and len(completion.logprobs) == 4
    for token_id, entries in zip(completion.token_ids, completion.logprobs, strict=True):
        assert len(entries) == 4 and entries[0].token_id == token_id and entries[0].rank == 1  # greedy
        assert [e.rank for e in entries[1:]] == [1, 2, 3] and entries[1].token_id == token_id


def test_max_tokens_none_runs_to_max_model_len(llm: LLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True)
    prompt = {"prompt_token_ids": list(range(100, 220))}  # 120 of the 128 positions
    (output,) = llm.generate(prompt, params, use_tqdm=False)
    assert len(output.outputs[0].token_ids) == 8 and output.outputs[0].finish_reason == "length"


def test_bad_prompts_raise_clearly_and_leave_the_engine_clean(llm: LLM) -> None:
    with pytest.raises(ValueError, match="max_model_len=128"):
        llm.generate(["fine", {"prompt_token_ids": list(range(10, 140))}], GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate({"prompt_token_ids": [10**9]}, GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="seed must fit in 64 bits"):
        llm.generate("x", SamplingParams(seed=2**70), use_tqdm=False)
    with pytest.raises(TypeError, match="prompt_token_ids"):
        llm.generate([{"text": "no"}], GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="2 sampling_params for 1 prompts"):
        llm.generate(["x"], [GREEDY, GREEDY], use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    assert llm.llm_engine.get_stats().kv_cache_usage == 0.0
    assert llm.generate("still works", GREEDY, use_tqdm=False)[0].outputs[0].finish_reason == "length"


def test_abort_frees_the_request(llm: LLM) -> None:
    engine = llm.llm_engine
    engine.add_request("keep", "Keep going", GREEDY)
    engine.add_request("drop", "Drop me", GREEDY)
    engine.step()
    assert engine.get_stats().kv_cache_usage > 0
    engine.abort_request(["drop"])
    finished = []
    while engine.has_unfinished_requests():
        finished += [o.request_id for o in engine.step() if o.finished]
    assert finished == ["keep"] and engine.get_stats().kv_cache_usage == 0.0


def test_the_models_other_eos_ids_act_as_stop_token_ids(llm: LLM) -> None:
    core = llm.llm_engine.engine_core
    saved = core.eos_token_ids
    core.eos_token_ids = [saved[0], 7]  # as if generation_config listed a second EOS id
    try:
        llm.llm_engine.add_request("eos", "Hello", SamplingParams(max_tokens=2, stop_token_ids=[9]))
        llm.llm_engine.add_request("ignore", "Hello", SamplingParams(max_tokens=2, ignore_eos=True))
        requests = core.scheduler.requests
        assert requests["eos"].sampling_params.stop_token_ids == [9, 7]
        assert requests["ignore"].sampling_params.stop_token_ids == []
    finally:
        llm.llm_engine.abort_request(["eos", "ignore"])
        core.eos_token_ids = saved
