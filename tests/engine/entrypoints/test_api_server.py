"""`bench serve --model tiny-random` end to end: the official openai SDK, raw HTTP for every error case,
concurrency, disconnects and metrics (shutdown and engine death: test_server_lifecycle.py)."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import aiohttp
import openai
import pytest
from serve_helpers import (
    API_KEY,
    ENGINE_KNOBS,
    MODEL,
    LiveServer,
    metric,
    post,
    read_chunks_then_disconnect,
    start_server,
    wait_until,
)

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "Once upon a time", "1, 2, 3, 4,", "def fibonacci(n):"]


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    live = start_server("--api-key", API_KEY, "--max-request-bytes", "65536")
    yield live
    live.stop()


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


# ------------------------------------------------------------------------------------------- the openai SDK


def counts(usage: Any) -> tuple[int, int, int]:
    return usage.prompt_tokens, usage.completion_tokens, usage.total_tokens


def test_completion_matches_openai_shape(client: openai.OpenAI) -> None:
    result = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=6, temperature=0,
                                       extra_body={"ignore_eos": True})  # fmt: skip
    assert result.id.startswith("cmpl-") and result.object == "text_completion" and result.model == MODEL
    assert isinstance(result.created, int) and len(result.choices) == 1
    choice = result.choices[0]
    assert choice.index == 0 and choice.finish_reason == "length" and choice.text
    assert result.usage is not None and result.usage.completion_tokens == 6
    assert result.usage.total_tokens == result.usage.prompt_tokens + 6
    timing = result.model_extra["servelab"]
    assert timing["arrival_time"] <= timing["first_scheduled_time"] <= timing["first_token_time"]
    assert timing["first_token_time"] <= timing["finished_time"]
    assert timing["num_preemptions"] == 0 and timing["num_cached_tokens"] >= 0
    assert timing["queue_time"] >= 0 and timing["prefill_time"] >= 0 and timing["decode_time"] >= 0
    assert abs(timing["received_time"] - (timing["arrival_time"] + timing["epoch_offset"])) < 60
    assert timing["api_arrival_time"] <= timing["arrival_time"]  # one monotonic clock: the handler starts first


def test_streamed_completion_equals_whole_and_reports_usage(client: openai.OpenAI) -> None:
    whole = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=10, temperature=0,
                                      extra_body={"ignore_eos": True})  # fmt: skip
    chunks = list(
        client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=10, temperature=0, stream=True,
                                  stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    )  # fmt: skip
    token_chunks, usage_chunk = chunks[:-1], chunks[-1]
    assert all(c.id == token_chunks[0].id and c.object == "text_completion" for c in chunks)
    assert len(token_chunks) == 10  # one chunk per generated token
    assert all(c.usage is None for c in token_chunks)
    assert "".join(c.choices[0].text for c in token_chunks) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in token_chunks][-2:] == [None, "length"]
    assert usage_chunk.choices == [] and counts(usage_chunk.usage) == counts(whole.usage)
    assert "servelab" in usage_chunk.model_extra


def test_continuous_usage_stats(client: openai.OpenAI) -> None:
    chunks = list(
        client.completions.create(model=MODEL, prompt=PROMPTS[2], max_tokens=5, temperature=0, stream=True,
                                  stream_options={"include_usage": True, "continuous_usage_stats": True},
                                  extra_body={"ignore_eos": True})
    )  # fmt: skip
    assert [c.usage.completion_tokens for c in chunks] == [1, 2, 3, 4, 5, 5]
    assert len({c.usage.prompt_tokens for c in chunks}) == 1


def test_continuous_usage_stats_in_chat_streams(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Count."}], max_tokens=4,
                                       temperature=0, stream=True, extra_body={"ignore_eos": True},
                                       stream_options={"include_usage": True, "continuous_usage_stats": True})
    )  # fmt: skip
    # the role chunk (no token yet), one chunk per token, then the final usage chunk
    assert [c.usage.completion_tokens for c in chunks] == [0, 1, 2, 3, 4, 4]
    assert len({c.usage.prompt_tokens for c in chunks}) == 1 and chunks[-1].choices == []


def test_chat_whole_and_streamed(server: LiveServer, client: openai.OpenAI) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=8, temperature=0,
                                           extra_body={"ignore_eos": True})  # fmt: skip
    assert whole.id.startswith("chatcmpl-") and whole.object == "chat.completion"
    assert whole.choices[0].message.role == "assistant" and whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 8
    chunks = list(
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0, stream=True,
                                       stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    )  # fmt: skip
    assert all(c.object == "chat.completion.chunk" and c.id.startswith("chatcmpl-") for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices == [] and counts(chunks[-1].usage) == counts(whole.usage)
    _, tokenized = post(server.url + "/tokenize", {"messages": messages})
    assert tokenized["count"] == whole.usage.prompt_tokens


def test_stop_string_truncates_and_finishes(client: openai.OpenAI) -> None:
    base = client.completions.create(model=MODEL, prompt=PROMPTS[3], max_tokens=24, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text  # fmt: skip
    stop = base[len(base) // 2 : len(base) // 2 + 3]
    assert stop.strip(), f"need a visible stop string from {base!r}"
    expected = base[: base.index(stop)]
    for stream in (False, True):
        kwargs = dict(model=MODEL, prompt=PROMPTS[3], max_tokens=24, temperature=0, stop=[stop],
                      extra_body={"ignore_eos": True})  # fmt: skip
        if stream:
            chunks = list(client.completions.create(stream=True, **kwargs))
            text = "".join(c.choices[0].text for c in chunks)
            last = chunks[-1].choices[0]
        else:
            last = client.completions.create(**kwargs).choices[0]
            text = last.text
        assert text == expected
        assert last.finish_reason == "stop" and last.model_extra["stop_reason"] == stop


def test_seeds_reproduce(client: openai.OpenAI) -> None:
    def sample(seed: int) -> str:
        return client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=12, temperature=1.0, seed=seed,
                                         extra_body={"ignore_eos": True}).choices[0].text  # fmt: skip

    assert sample(7) == sample(7)
    assert sample(7) != sample(8)


def test_logprobs(client: openai.OpenAI) -> None:
    result = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=3, temperature=0, logprobs=2,
                                       extra_body={"ignore_eos": True})  # fmt: skip
    logprobs = result.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 3
    assert "".join(logprobs.tokens) == result.choices[0].text
    assert all(lp <= 0 for lp in logprobs.token_logprobs)
    # greedy: the sampled token is the most likely one
    pairs = zip(logprobs.top_logprobs, logprobs.token_logprobs, strict=True)
    assert all(abs(max(top.values()) - lp) < 1e-4 for top, lp in pairs)
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                          temperature=0, logprobs=True, top_logprobs=2,
                                          extra_body={"ignore_eos": True})  # fmt: skip
    content = chat.choices[0].logprobs.content
    assert len(content) == 3 and all(len(item.top_logprobs) == 2 for item in content)
    assert "".join(item.token for item in content) == chat.choices[0].message.content
    assert all(item.logprob == item.top_logprobs[0].logprob for item in content)


def test_greedy_http_equals_offline_llm(client: openai.OpenAI) -> None:
    from engine import LLM, SamplingParams

    http = [
        client.completions.create(model=MODEL, prompt=p, max_tokens=12, temperature=0).choices[0] for p in PROMPTS
    ]
    llm = LLM(model=MODEL, **ENGINE_KNOBS)
    offline = llm.generate(PROMPTS, SamplingParams(max_tokens=12, temperature=0.0), use_tqdm=False)
    for choice, output in zip(http, offline, strict=True):
        assert choice.text == output.outputs[0].text
        assert choice.finish_reason == output.outputs[0].finish_reason
    for output in offline:  # the same prompts sent as token ids
        by_ids = client.completions.create(model=MODEL, prompt=output.prompt_token_ids, max_tokens=12, temperature=0)
        assert by_ids.choices[0].text == output.outputs[0].text
        assert by_ids.usage.prompt_tokens == len(output.prompt_token_ids)


# ------------------------------------------------------------------------------------------- errors

USER_X = [{"role": "user", "content": "x"}]
ERROR_CASES = [
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"prompt": "hi", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"prompt": "hi", "top_p": 1.01}, 400, "top_p"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "many"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "n": 0}, 400, "n"),
    ("/v1/completions", {"prompt": "hi", "seed": 2**64}, 400, "seed"),  # would crash torch's generator
    ("/v1/completions", {"prompt": "hi", "max_tokens": 256}, 400, "max_tokens"),  # prompt + 256 > 256
    ("/v1/completions", {"prompt": [1] * 256}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": [10**9]}, 400, "prompt"),
    ("/v1/completions", {"prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"prompt": 42}, 400, "prompt"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": USER_X, "response_format": {"type": "json_schema"}}, 400, "response_format"),
    ("/v1/completions", {"prompt": "hi", "structured_outputs": {"regex": "(ab"}}, 400, "structured_outputs"),
    ("/v1/completions", {"prompt": "hi", "guided_json": {"type": "objectx"}}, 400, "guided_json"),
    ("/v1/chat/completions", {"messages": USER_X, "tools": [{"type": "function"}]}, 400, "tools"),
    ("/v1/completions", {"prompt": "hi", "model": "no-such-model"}, 404, "model"),
    ("/v1/chat/completions", {"messages": USER_X, "model": "gpt-4"}, 404, "model"),
]


@pytest.mark.parametrize(("path", "body", "status", "param"), ERROR_CASES)
def test_error_cases(server: LiveServer, path: str, body: dict[str, Any], status: int, param: str) -> None:
    code, answer = post(server.url + path, {"model": MODEL, **body})
    assert code == status
    assert set(answer["error"]) == {"message", "type", "param", "code"}
    assert answer["error"]["param"] == param and answer["error"]["message"]


def test_bad_requests_never_disturb_a_stream_in_flight(server: LiveServer, client: openai.OpenAI) -> None:
    body = {"model": MODEL, "prompt": PROMPTS[1], "max_tokens": 200, "temperature": 0, "ignore_eos": True}
    auth = {"Authorization": f"Bearer {API_KEY}"}
    url = server.url + "/v1/completions"

    async def bad(session: aiohttp.ClientSession, path: str, bad_body: dict[str, Any]) -> int:
        async with session.post(server.url + path, json={"model": MODEL, **bad_body}, headers=auth) as response:
            await response.read()
            return response.status

    async def malformed(session: aiohttp.ClientSession) -> int:
        async with session.post(url, data=b'{"prompt": ', headers=auth) as response:
            return response.status

    async def run() -> tuple[list[int], str, int]:
        async with aiohttp.ClientSession() as session:
            async with session.post(url, json={**body, "stream": True}, headers=auth) as response:
                texts: list[str] = []
                statuses: list[int] = []
                async for line in response.content:
                    if not line.startswith(b"data: {"):
                        continue
                    chunk = json.loads(line.removeprefix(b"data: "))
                    texts.append(chunk["choices"][0]["text"])
                    if len(texts) == 1:  # the stream is running: fire every bad request at once
                        statuses = await asyncio.gather(
                            *(bad(session, path, bad_body) for path, bad_body, _, _ in ERROR_CASES), malformed(session)
                        )
                return statuses, "".join(texts), len(texts)

    statuses, text, num_chunks = asyncio.run(run())  # one chunk per token
    assert statuses == [status for _, _, status, _ in ERROR_CASES] + [400]
    whole = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=200, temperature=0,
                                      extra_body={"ignore_eos": True})  # fmt: skip
    assert num_chunks == 200 and text == whole.choices[0].text


def test_transport_level_errors(server: LiveServer) -> None:
    url = server.url + "/v1/completions"
    code, answer = post(url, None, raw=b'{"prompt": "hi",')
    assert code == 400 and "JSON" in answer["error"]["message"]
    code, answer = post(url, {"prompt": "hi"}, key=None)
    assert code == 401 and answer["error"]["code"] == "invalid_api_key"
    code, answer = post(url, {"prompt": "hi"}, key="wrong")
    assert code == 401 and answer["error"]["code"] == "invalid_api_key"
    code, answer = post(url, {"prompt": "x" * 70_000})
    assert code == 413 and answer["error"]["code"] == "request_too_large"
    code, answer = post(server.url + "/v1/no-such-route", {})
    assert code == 404 and answer["error"]["code"] == "unknown_url"
    # the server still serves, and nothing is left running
    code, answer = post(url, {"model": MODEL, "prompt": "hi", "max_tokens": 2})
    assert code == 200 and answer["usage"]["completion_tokens"] <= 2
    assert wait_until(lambda: metric(server, "vllm:num_requests_running") == 0)


def test_startup_line_names_model_kv_capacity_and_url(server: LiveServer) -> None:
    startup = [line for line in server.log if line.startswith("Serving ")]
    assert len(startup) == 1
    blocks = ENGINE_KNOBS["num_gpu_blocks_override"]
    assert f"Serving {MODEL} " in startup[0] and f"KV cache {blocks} blocks x 16 = {blocks * 16} tokens" in startup[0]
    assert startup[0].rstrip().endswith(f"at {server.url}") and server.url.startswith("http://127.0.0.1:")


def test_other_routes(server: LiveServer) -> None:
    request = urllib.request.Request(server.url + "/v1/models", headers={"Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(request) as response:
        models = json.loads(response.read())
    assert models["object"] == "list" and models["data"][0]["id"] == MODEL
    assert models["data"][0]["max_model_len"] == ENGINE_KNOBS["max_model_len"]
    code, tokens = post(server.url + "/tokenize", {"prompt": "hello world"})
    assert code == 200 and tokens["count"] == len(tokens["tokens"]) > 0
    code, text = post(server.url + "/detokenize", {"tokens": tokens["tokens"]})
    assert code == 200 and text["prompt"] == "hello world"
    code, answer = post(server.url + "/reset_prefix_cache", {})
    assert code == 200 and answer["success"]


# ------------------------------------------------------------------------------------------- concurrency


def test_32_simultaneous_streams_complete(server: LiveServer) -> None:
    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[int, int, int]:
        stream = await client.completions.create(
            model=MODEL, prompt=f"{PROMPTS[i % 4]} {i}", max_tokens=8 + i % 5, temperature=0.8, seed=i, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )  # fmt: skip
        chunks = [chunk async for chunk in stream]
        return chunks[-1].usage.completion_tokens, len(chunks) - 1, chunks[-1].usage.prompt_tokens

    async def run() -> list[tuple[int, int, int]]:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=300)
        return await asyncio.gather(*(one(client, i) for i in range(32)))

    results = asyncio.run(run())
    for i, (completion_tokens, num_token_chunks, prompt_tokens) in enumerate(results):
        assert completion_tokens == num_token_chunks == 8 + i % 5
        _, tokens = post(server.url + "/tokenize", {"prompt": f"{PROMPTS[i % 4]} {i}"})
        assert prompt_tokens == tokens["count"]


def test_cut_streams_are_aborted(server: LiveServer) -> None:
    generated_before = metric(server, "vllm:generation_tokens_total")
    max_tokens = 200

    async def cut(session: aiohttp.ClientSession, i: int) -> None:
        body = {"model": MODEL, "prompt": f"{PROMPTS[i % 4]} cut {i}", "max_tokens": max_tokens, "stream": True,
                "ignore_eos": True}  # fmt: skip
        await read_chunks_then_disconnect(session, server.url + "/v1/completions", body, 2)

    async def give_up_waiting(session: aiohttp.ClientSession, i: int) -> None:
        body = {"model": MODEL, "prompt": f"{PROMPTS[i % 4]} wait {i}", "max_tokens": 240, "ignore_eos": True}
        with pytest.raises(asyncio.TimeoutError):
            await session.post(server.url + "/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=0.3),
                               headers={"Authorization": f"Bearer {API_KEY}"})  # fmt: skip

    async def run() -> None:
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(*(cut(session, i) for i in range(8)), *(give_up_waiting(session, i) for i in range(2)))

    asyncio.run(run())
    assert wait_until(lambda: metric(server, "vllm:num_requests_running") == 0, timeout=120)
    assert metric(server, "vllm:kv_cache_usage_perc") == 0
    assert metric(server, "vllm:num_requests_waiting") == 0
    # aborted early: far fewer tokens than the 10 full requests would have produced
    assert metric(server, "vllm:generation_tokens_total") - generated_before < 10 * max_tokens / 2


def test_metrics_exported_with_vllm_names(server: LiveServer) -> None:
    for name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                 "vllm:time_to_first_token_seconds_count", "vllm:inter_token_latency_seconds_count",
                 "vllm:e2e_request_latency_seconds_count", "vllm:request_queue_time_seconds_count",
                 "vllm:request_prefill_time_seconds_count", "vllm:request_decode_time_seconds_count"):  # fmt: skip
        assert metric(server, name) > 0 or name == "vllm:num_preemptions_total", name
    assert metric(server, "vllm:prompt_tokens_total") > 0
