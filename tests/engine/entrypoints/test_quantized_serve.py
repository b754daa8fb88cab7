"""`bench serve --quantization int4` end to end: greedy completions equal the offline engine's with the same knobs,
and completions `echo` + `logprobs` return the prompt with its prompt_logprobs (vLLM's shape)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from serve_helpers import ENGINE_KNOBS, MODEL, LiveServer, post, start_server

from engine import LLM, SamplingParams

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "def fibonacci(n):"]


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    live = start_server("--quantization", "int4")
    yield live
    live.stop()


@pytest.fixture(scope="module")
def offline() -> LLM:
    return LLM(model=MODEL, quantization="int4", **ENGINE_KNOBS)


def test_greedy_int4_http_equals_offline(server: LiveServer, offline: LLM) -> None:
    expected = offline.generate(PROMPTS, SamplingParams(max_tokens=8, temperature=0.0), use_tqdm=False)
    for prompt, output in zip(PROMPTS, expected, strict=True):
        status, body = post(server.url + "/v1/completions", {"prompt": prompt, "max_tokens": 8, "temperature": 0})
        assert status == 200 and body["choices"][0]["text"] == output.outputs[0].text


def test_echo_with_logprobs_returns_the_prompt_and_its_logprobs(server: LiveServer, offline: LLM) -> None:
    prompt = PROMPTS[0]
    params = SamplingParams(max_tokens=3, temperature=0.0, logprobs=1, prompt_logprobs=1)
    (expected,) = offline.generate(prompt, params, use_tqdm=False)
    request = {"prompt": prompt, "max_tokens": 3, "temperature": 0, "echo": True, "logprobs": 1}
    status, body = post(server.url + "/v1/completions", request)
    assert status == 200, body
    choice = body["choices"][0]
    assert choice["text"] == prompt + expected.outputs[0].text
    num_prompt = len(expected.prompt_token_ids)
    logprobs = choice["logprobs"]
    assert len(logprobs["tokens"]) == num_prompt + 3
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert expected.prompt_logprobs is not None
    for position in range(1, num_prompt):
        token_id = expected.prompt_token_ids[position]
        got = logprobs["token_logprobs"][position]
        assert got == pytest.approx(expected.prompt_logprobs[position][token_id].logprob, abs=1e-5)
    assert logprobs["text_offset"][num_prompt] == len(prompt)
