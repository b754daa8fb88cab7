"""Request validation: every bad field gets a 400 naming it; good bodies become the right SamplingParams."""

from __future__ import annotations

import pytest

from engine.entrypoints.protocol import ApiError, parse_chat_request, parse_completion_request

MESSAGES = [{"role": "user", "content": "hi"}]


def completion(**fields: object) -> dict[str, object]:
    return {"model": "m", "prompt": "hello", **fields}


def chat(**fields: object) -> dict[str, object]:
    return {"model": "m", "messages": MESSAGES, **fields}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (completion(max_tokens=0), "max_tokens"),
        (completion(max_tokens=-3), "max_tokens"),
        (completion(max_tokens="16"), "max_tokens"),
        (completion(max_tokens=True), "max_tokens"),
        (completion(max_tokens=1.5), "max_tokens"),
        (completion(temperature=-0.1), "temperature"),
        (completion(temperature="hot"), "temperature"),
        (completion(top_p=0.0), "top_p"),
        (completion(top_p=1.5), "top_p"),
        (completion(top_k=-2), "top_k"),
        (completion(min_p=2.0), "min_p"),
        (completion(presence_penalty=3.0), "presence_penalty"),
        (completion(frequency_penalty=-2.5), "frequency_penalty"),
        (completion(repetition_penalty=0.0), "repetition_penalty"),
        (completion(seed="x"), "seed"),
        (completion(seed=2**64), "seed"),
        (completion(max_tokens=1e300), "max_tokens"),
        (completion(stop_token_ids=[-5]), "stop_token_ids"),
        (completion(stop=""), "stop"),
        (completion(stop=[1, 2]), "stop"),
        (completion(stop_token_ids=["a"]), "stop_token_ids"),
        (completion(ignore_eos="yes"), "ignore_eos"),
        (completion(min_tokens=-1), "min_tokens"),
        (completion(min_tokens=20, max_tokens=4), "min_tokens"),
        (completion(logprobs=21), "logprobs"),
        (completion(n=0), "n"),
        (completion(n=129), "n"),
        (chat(n=-1), "n"),
        (completion(best_of=3), "best_of"),
        (completion(echo=True, stream=True), "echo"),
        (completion(suffix="tail"), "suffix"),
        (completion(logit_bias={"1": 5}), "logit_bias"),
        (completion(stream="true"), "stream"),
        (completion(stream_options={"include_usage": True}), "stream_options"),
        (completion(stream=True, stream_options=[1]), "stream_options"),
        (completion(stream=True, stream_options={"include_usage": "yes"}), "include_usage"),
        (completion(model=7), "model"),
        (completion(prompt=""), "prompt"),
        (completion(prompt=[]), "prompt"),
        (completion(prompt=["a", "b"]), "prompt"),
        (completion(prompt=[1, "x"]), "prompt"),
        (completion(prompt=[1, True]), "prompt"),
        (completion(prompt=12), "prompt"),
        ({"model": "m"}, "prompt"),
        (chat(messages=[]), "messages"),
        (chat(messages="hi"), "messages"),
        (chat(messages=[{"role": "wizard", "content": "x"}]), "messages[0]"),
        (chat(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
        (chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), "messages[0]"),
        (chat(response_format={"type": "json_schema"}), "response_format"),
        (chat(tools=[{"type": "function", "function": {"name": "f"}}]), "tools"),
        (chat(tool_choice="auto"), "tool_choice"),
        (chat(top_logprobs=3), "top_logprobs"),
        (chat(logprobs=True, top_logprobs=30), "top_logprobs"),
        (chat(max_completion_tokens=0), "max_completion_tokens"),
        ({"model": "m"}, "messages"),
    ],
)
def test_bad_fields_are_400_naming_the_field(body: dict[str, object], param: str | None) -> None:
    is_chat = "messages" in body or param == "messages"
    parse = parse_chat_request if is_chat else parse_completion_request
    with pytest.raises(ApiError) as caught:
        parse(body)
    error = caught.value
    assert error.status == 400
    assert error.param == param
    body_json = error.to_body()["error"]
    assert set(body_json) == {"message", "type", "param", "code"}
    assert body_json["type"] == "invalid_request_error" and body_json["message"]


@pytest.mark.parametrize("body", [[], "text", 3, None])
def test_body_must_be_an_object(body: object) -> None:
    for parse in (parse_completion_request, parse_chat_request):
        with pytest.raises(ApiError) as caught:
            parse(body)
        assert caught.value.status == 400


def test_completion_fields_map_to_sampling_params() -> None:
    request = parse_completion_request(
        completion(
            prompt=["only one"], max_tokens=7.0, temperature=0, top_p=0.5, top_k=-1, min_p=0.1, seed=3,
            stop="END", stop_token_ids=[5], ignore_eos=True, min_tokens=2, presence_penalty=0.5,
            frequency_penalty=-0.5, repetition_penalty=1.2, logprobs=2, stream=True, n=3,
            stream_options={"include_usage": True, "continuous_usage_stats": True}, unknown_field={"x": 1},
        )
    )  # fmt: skip
    params = request.sampling_params
    assert request.prompt == "only one" and request.stream and request.logprobs == 2
    assert request.stream_options.include_usage and request.stream_options.continuous_usage_stats
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k, params.min_p) == (7, 0.0, 0.5, 0, 0.1)
    assert (params.seed, params.stop, params.stop_token_ids, params.ignore_eos, params.min_tokens) == (
        3, ["END"], [5], True, 2,
    )  # fmt: skip
    assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty) == (0.5, -0.5, 1.2)
    assert params.logprobs == 2 and params.is_greedy and params.n == 3


def test_completion_defaults_follow_openai() -> None:
    request = parse_completion_request({"prompt": [[1, 2, 3]]})
    assert request.prompt == [1, 2, 3] and request.model is None
    assert request.sampling_params.max_tokens == 16 and request.sampling_params.temperature == 1.0
    assert not request.stream and request.logprobs is None


def test_chat_fields() -> None:
    request = parse_chat_request(
        chat(
            messages=[
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": None},
            ],
            max_completion_tokens=5, max_tokens=9, logprobs=True, top_logprobs=2, response_format={"type": "text"},
        )
    )  # fmt: skip
    assert request.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": ""},
    ]
    assert request.sampling_params.max_tokens == 5 and request.max_tokens_param == "max_completion_tokens"
    assert request.sampling_params.logprobs == 2 and request.logprobs and request.top_logprobs == 2


def test_chat_without_max_tokens_runs_to_the_context_limit() -> None:
    request = parse_chat_request(chat())
    assert request.sampling_params.max_tokens is None and request.max_tokens_param == "max_tokens"


def test_echo_with_logprobs_asks_for_prompt_logprobs() -> None:
    req = parse_completion_request({"prompt": "hi", "echo": True, "logprobs": 2})
    assert req.echo and req.sampling_params.prompt_logprobs == 2 and req.sampling_params.logprobs == 2
    plain = parse_completion_request({"prompt": "hi", "echo": True})
    assert plain.echo and plain.sampling_params.prompt_logprobs is None
