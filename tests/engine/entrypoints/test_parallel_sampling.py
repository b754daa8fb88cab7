"""`n` completions per request through `bench serve` and the official openai SDK: n choices (streamed chunks
carry their index), usage over all of them, shared prompt blocks, and a cut stream aborts every child."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import aiohttp
import openai
import pytest
from serve_helpers import (
    API_KEY,
    MODEL,
    LiveServer,
    metric,
    post,
    read_chunks_then_disconnect,
    start_server,
    wait_until,
)

pytestmark = pytest.mark.slow

PROMPT = "The three little pigs"
IGNORE_EOS = {"ignore_eos": True}


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    live = start_server("--api-key", API_KEY)
    yield live
    live.stop()


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


def streamed_texts(chunks: list[Any], text_of: Any) -> dict[int, str]:
    texts: dict[int, str] = defaultdict(str)
    for chunk in chunks:
        assert len(chunk.choices) <= 1
        for choice in chunk.choices:
            texts[choice.index] += text_of(choice) or ""
    return dict(texts)


def test_greedy_n_gives_n_identical_choices_equal_to_n_1(client: openai.OpenAI) -> None:
    single = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, extra_body=IGNORE_EOS)
    result = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, n=3,
                                       extra_body=IGNORE_EOS)  # fmt: skip
    assert [c.index for c in result.choices] == [0, 1, 2]
    assert all(c.text == single.choices[0].text and c.finish_reason == "length" for c in result.choices)
    assert result.usage.prompt_tokens == single.usage.prompt_tokens and result.usage.completion_tokens == 3 * 8
    timing = result.model_extra["servelab"]
    assert timing["arrival_time"] <= timing["first_token_time"] <= timing["finished_time"]


def test_seeded_n_streams_each_choice_by_index_and_reproduces(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = dict(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=1.0, seed=5, n=3,
                                  extra_body=IGNORE_EOS)  # fmt: skip
    whole = client.completions.create(**kwargs)
    texts = [c.text for c in whole.choices]
    assert len(set(texts)) == 3  # each child has its own seed (5, 6, 7)
    assert [c.text for c in client.completions.create(**kwargs).choices] == texts
    child = client.completions.create(**{**kwargs, "n": 1, "seed": 6})
    assert child.choices[0].text == texts[1]
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    usage_chunk, token_chunks = chunks[-1], chunks[:-1]
    assert len(token_chunks) == 3 * 10  # one chunk per token per choice
    assert streamed_texts(token_chunks, lambda c: c.text) == dict(enumerate(texts))
    finishes = [c.choices[0].index for c in token_chunks if c.choices[0].finish_reason == "length"]
    assert sorted(finishes) == [0, 1, 2]
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens == 30
    assert usage_chunk.usage.prompt_tokens == whole.usage.prompt_tokens and "servelab" in usage_chunk.model_extra


def test_chat_n_whole_and_streamed(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = dict(model=MODEL, messages=[{"role": "user", "content": "Name a colour."}],
                                  max_tokens=6, temperature=0.9, seed=3, n=2, extra_body=IGNORE_EOS)  # fmt: skip
    whole = client.chat.completions.create(**kwargs)
    assert [c.index for c in whole.choices] == [0, 1] and whole.usage.completion_tokens == 12
    assert all(c.message.role == "assistant" and c.finish_reason == "length" for c in whole.choices)
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    roles = [(c.choices[0].index, c.choices[0].delta.role) for c in chunks[:2]]
    assert roles == [(0, "assistant"), (1, "assistant")]  # each choice's role chunk comes first
    assert streamed_texts(chunks, lambda c: c.delta.content) == {c.index: c.message.content for c in whole.choices}
    assert "servelab" in chunks[-1].model_extra and chunks[-1].choices[0].finish_reason == "length"


def test_children_share_the_prompt_blocks(server: LiveServer) -> None:
    url = server.url + "/v1/completions"
    prompt = list(range(500, 500 + 3 * 16 + 4))  # 3 full blocks of 16 (the default block size) and a tail
    assert post(server.url + "/reset_prefix_cache", {})[0] == 200
    hits_before = metric(server, "vllm:prefix_cache_hits_total")
    code, answer = post(url, {"model": MODEL, "prompt": prompt, "max_tokens": 2, "n": 3, "temperature": 1.0})
    assert code == 200 and len(answer["choices"]) == 3
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # the prompt was new
    assert wait_until(lambda: metric(server, "vllm:prefix_cache_hits_total") - hits_before == 2 * 3 * 16, timeout=10)


def test_cutting_a_stream_aborts_every_child(server: LiveServer) -> None:
    generated_before = metric(server, "vllm:generation_tokens_total")
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 200, "n": 4, "stream": True, "ignore_eos": True}

    async def cut() -> None:
        async with aiohttp.ClientSession() as session:
            await read_chunks_then_disconnect(session, server.url + "/v1/completions", body, 4)

    asyncio.run(cut())
    assert wait_until(lambda: metric(server, "vllm:num_requests_running") == 0, timeout=120)
    assert metric(server, "vllm:kv_cache_usage_perc") == 0
    assert metric(server, "vllm:generation_tokens_total") - generated_before < 4 * 200 / 2


def test_bad_n_is_a_400_naming_n(server: LiveServer) -> None:
    for n in (0, 129, "3"):
        code, answer = post(server.url + "/v1/completions", {"model": MODEL, "prompt": "hi", "n": n})
        assert code == 400 and answer["error"]["param"] == "n"
