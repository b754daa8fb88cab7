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
    core, processor = llm.llm_engine.engine_core, llm.llm_engine.processor
    saved = processor.eos_token_ids
    processor.eos_token_ids = [saved[0], 7]  # as if generation_config listed a second EOS id
    try:
        llm.llm_engine.add_request("eos", "Hello", SamplingParams(max_tokens=2, stop_token_ids=[9]))
        llm.llm_engine.add_request("ignore", "Hello", SamplingParams(max_tokens=2, ignore_eos=True))
        requests = core.scheduler.requests
        assert requests["eos"].sampling_params.stop_token_ids == [9, 7]
        assert requests["ignore"].sampling_params.stop_token_ids == []
    finally:
        llm.llm_engine.abort_request(["eos", "ignore"])
        processor.eos_token_ids = saved


# ------------------------------------------------------------------------------------------- parallel sampling (n)


def test_n_greedy_gives_n_identical_completions_equal_to_n_1(llm: LLM) -> None:
    (single,) = llm.generate("Parallel sampling", GREEDY, use_tqdm=False)
    params = SamplingParams(n=3, temperature=0.0, max_tokens=12, ignore_eos=True)
    (fanned,) = llm.generate("Parallel sampling", params, use_tqdm=False)
    assert [c.index for c in fanned.outputs] == [0, 1, 2]
    for completion in fanned.outputs:
        assert completion.token_ids == single.outputs[0].token_ids and completion.text == single.outputs[0].text
        assert completion.finish_reason == "length"
    assert fanned.finished and fanned.timing is not None and fanned.timing.finished_time is not None
    assert not llm.llm_engine.has_unfinished_requests() and llm.llm_engine.get_stats().kv_cache_usage == 0.0


def test_n_seeded_sampling_is_reproducible_and_the_children_differ(llm: LLM) -> None:
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=10, ignore_eos=True)
    (first,) = llm.generate("A story in three takes", params, use_tqdm=False)
    (again,) = llm.generate("A story in three takes", params, use_tqdm=False)
    takes = [c.token_ids for c in first.outputs]
    assert takes == [c.token_ids for c in again.outputs]
    assert len({tuple(t) for t in takes}) == 3
    # child i is seeded seed + i, as in vLLM: child 1 of seed 7 samples what an n=1 request with seed 8 does
    (child,) = llm.generate("A story in three takes", SamplingParams(temperature=1.0, seed=8, max_tokens=10,
                                                                     ignore_eos=True), use_tqdm=False)  # fmt: skip
    assert child.outputs[0].token_ids == takes[1]


def test_n_children_share_the_prompt_blocks(llm: LLM) -> None:
    engine = llm.llm_engine
    block_size = engine.config.cache_config.block_size
    prompt = {"prompt_token_ids": list(range(300, 300 + 3 * block_size + 5))}
    assert engine.reset_prefix_cache()
    before = engine.get_stats().prefix_cache_hits
    llm.generate(prompt, SamplingParams(n=3, temperature=1.0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    # children 2 and 3 find the 3 full prompt blocks child 1 computes (admitted in the same step)
    assert engine.get_stats().prefix_cache_hits - before == 2 * 3 * block_size


def test_n_stop_strings_end_each_child_on_its_own(llm: LLM) -> None:
    free = SamplingParams(n=4, temperature=1.0, seed=11, max_tokens=12, ignore_eos=True)
    (unstopped,) = llm.generate("Stops per child", free, use_tqdm=False)
    texts = [c.text for c in unstopped.outputs]
    stop = next(t[4:6] for t in texts if t[4:6].strip())
    (stopped,) = llm.generate("Stops per child", SamplingParams(**{**vars(free), "stop": [stop]}), use_tqdm=False)
    for text, completion in zip(texts, stopped.outputs, strict=True):
        if stop in text:
            assert (completion.finish_reason, completion.stop_reason) == ("stop", stop)
            assert completion.text == text[: text.index(stop)]
        else:
            assert completion.finish_reason == "length" and completion.text == text
    assert not llm.llm_engine.has_unfinished_requests() and llm.llm_engine.get_stats().kv_cache_usage == 0.0


def test_aborting_a_parent_aborts_all_its_children(llm: LLM) -> None:
    engine = llm.llm_engine
    engine.add_request("fan", "Fan out", SamplingParams(n=3, temperature=1.0, max_tokens=20, ignore_eos=True))
    engine.add_request("solo", "Alone", GREEDY)
    engine.step()
    assert engine.get_stats().num_running_reqs == 4
    engine.abort_request(["fan"])
    assert engine.get_stats().num_running_reqs == 1
    finished = []
    while engine.has_unfinished_requests():
        finished += [o.request_id for o in engine.step() if o.finished]
    assert finished == ["solo"] and engine.get_stats().kv_cache_usage == 0.0


def test_n_bad_values_are_clear_errors(llm: LLM) -> None:
    with pytest.raises(ValueError, match="n must be >= 1, got 0"):
        SamplingParams(n=0)
    with pytest.raises(ValueError, match=r"seed \+ 2 \(the last of the n=3 samples' seeds\) must fit in 64 bits"):
        llm.generate("x", SamplingParams(n=3, seed=2**64 - 2), use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
