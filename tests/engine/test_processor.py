"""engine/processor.py without a model: request building and its errors, the n-way fan-out, output processing."""

from __future__ import annotations

import pytest

from engine.outputs import EngineCoreOutput, Logprob
from engine.processor import CompletionState, ParentRequest, Processor, RequestError, child_requests, merge_timings
from engine.request import RequestTiming
from engine.sampling_params import SamplingParams
from engine.tokenizer import get_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return get_tokenizer("smollm2-135m")


@pytest.fixture
def processor(tokenizer) -> Processor:
    return Processor(tokenizer, max_model_len=32, vocab_size=len(tokenizer), eos_token_ids=[2, 7])


def test_build_request_resolves_max_tokens_eos_and_extra_eos_stop_ids(processor: Processor) -> None:
    request = processor.build_request("r", [5, 6, 8], SamplingParams(max_tokens=None, stop_token_ids=[9]), 12.5)
    assert request.prompt_token_ids == [5, 6, 8] and request.max_tokens == 29 and request.eos_token_id == 2
    assert request.sampling_params.stop_token_ids == [9, 7] and request.timing.arrival_time == 12.5
    ignoring = processor.build_request("i", [5], SamplingParams(ignore_eos=True))
    assert ignoring.sampling_params.stop_token_ids == [] and ignoring.max_tokens == 16
    text = processor.build_request("t", "Hello world", SamplingParams())
    assert text.prompt_token_ids == processor.tokenizer.encode("Hello world")


@pytest.mark.parametrize(
    ("prompt", "params", "max_tokens_param", "param", "message"),
    [
        ([], SamplingParams(), None, "prompt", "the prompt is empty"),
        ([5, 49152], SamplingParams(), "max_tokens", "prompt", r"token ids must be in \[0, 49152\), got \[49152\]"),
        ([5], SamplingParams(seed=2**64), None, "seed", "seed must fit in 64 bits, got seed=18446744073709551616"),
        ([5] * 20, SamplingParams(max_tokens=13), "max_completion_tokens", "max_completion_tokens",
         r"^This model's maximum context length is 32 tokens\. However, you requested 33 tokens \(20 in the prompt, "
         r"13 in the completion\)\. Please reduce the length of the prompt or the max_completion_tokens\.$"),
        ([5] * 32, SamplingParams(max_tokens=None), "max_tokens", "prompt",
         r"^This model's maximum context length is 32 tokens\. However, your prompt has 32 tokens, which leaves no "
         r"room for output\. Please reduce the length of the prompt\.$"),
        ([5] * 32, SamplingParams(), None, "prompt", "the prompt has 32 tokens, but max_model_len=32 leaves no room"),
    ],
)  # fmt: skip
def test_bad_requests_raise_request_error_naming_the_param(
    processor: Processor, prompt: list[int], params: SamplingParams, max_tokens_param: str | None, param: str,
    message: str,
) -> None:  # fmt: skip
    with pytest.raises(RequestError, match=message) as caught:
        processor.build_request("r", prompt, params, max_tokens_param=max_tokens_param)
    assert caught.value.param == param


def test_the_offline_engine_lets_max_tokens_run_into_max_model_len(processor: Processor) -> None:
    request = processor.build_request("r", [5] * 20, SamplingParams(max_tokens=13))
    assert request.max_tokens == 13  # the scheduler ends it at max_model_len with finish_reason "length"


def test_children_get_their_own_ids_seeds_and_state(processor: Processor) -> None:
    request = processor.build_request("req", [5, 6], SamplingParams(n=3, seed=40, temperature=0.8))
    children = child_requests(request)
    assert [c.request_id for c in children] == ["0_req", "1_req", "2_req"]
    assert [c.sampling_params.seed for c in children] == [40, 41, 42]
    assert all(c.sampling_params.n == 1 and c.sampling_params.temperature == 0.8 for c in children)
    assert all(c.sampling_params.stop_token_ids == [7] and c.max_tokens == 16 for c in children)
    assert len({id(c.prompt_token_ids) for c in children} | {id(c.output_token_ids) for c in children}) == 6
    single = processor.build_request("one", [5], SamplingParams())
    assert child_requests(single) == [single]
    unseeded = child_requests(processor.build_request("u", [5], SamplingParams(n=2)))
    assert [c.sampling_params.seed for c in unseeded] == [None, None]


def test_merge_timings_spans_the_children() -> None:
    a = RequestTiming(1.0, 2.0, 3.0, 9.0, num_preemptions=1, num_cached_tokens=0)
    b = RequestTiming(1.0, 1.5, 3.5, 8.0, num_preemptions=2, num_cached_tokens=16)
    merged = merge_timings([a, b])
    assert (merged.arrival_time, merged.first_scheduled_time, merged.first_token_time) == (1.0, 1.5, 3.0)
    assert (merged.finished_time, merged.num_preemptions, merged.num_cached_tokens) == (9.0, 3, 0)
    assert merge_timings([a, RequestTiming(1.0)]).finished_time is None
    assert merge_timings([a]) is a


def test_completion_state_stops_inside_a_multi_token_output(processor: Processor, tokenizer) -> None:
    ids = tokenizer.encode(" one two three four", add_special_tokens=False)
    request = processor.build_request("r", [5], SamplingParams(stop=[" three"], logprobs=0))
    state = CompletionState(tokenizer, request, 0)
    logprobs = [[Logprob(t, -0.5, 1)] for t in ids]
    delta = state.update(EngineCoreOutput("r", ids, logprobs))  # e.g. accepted draft tokens
    assert delta.stopped_by_string and (delta.finish_reason, delta.stop_reason) == ("stop", " three")
    assert delta.text == " one two" and delta.token_ids == ids[:3] and delta.logprobs == logprobs[:3]
    output = state.completion_output()
    assert output.text == " one two" and output.token_ids == ids[:3] and output.logprobs == logprobs[:3]


def test_a_stop_string_on_the_engines_last_token_is_not_an_early_stop(processor: Processor, tokenizer) -> None:
    ids = tokenizer.encode(" one two", add_special_tokens=False)
    state = CompletionState(tokenizer, processor.build_request("r", [5], SamplingParams(stop=[" two"])), 0)
    delta = state.update(EngineCoreOutput("r", ids, finish_reason="length"))
    assert (delta.finish_reason, delta.stop_reason, delta.stopped_by_string) == ("stop", " two", False)


def test_parent_routes_children_and_reports_all_completions(processor: Processor, tokenizer) -> None:
    parent = ParentRequest(processor.build_request("p", [5], SamplingParams(n=2)), tokenizer, "prompt text")
    hello, world = (
        tokenizer.encode(" hello", add_special_tokens=False),
        tokenizer.encode(" world", add_special_tokens=False),
    )
    assert parent.update(EngineCoreOutput("1_p", world)).index == 1
    output = parent.request_output()
    assert not output.finished and [c.text for c in output.outputs] == ["", " world"] and output.timing is None
    assert parent.update(EngineCoreOutput("0_p", hello, finish_reason="length")).finished
    assert not parent.finished
    parent.update(EngineCoreOutput("1_p", [], finish_reason="stop"))
    output = parent.request_output()
    assert output.finished and output.prompt == "prompt text" and output.timing is not None
    assert [(c.index, c.text, c.finish_reason) for c in output.outputs] == [(0, " hello", "length"),
                                                                             (1, " world", "stop")]  # fmt: skip
