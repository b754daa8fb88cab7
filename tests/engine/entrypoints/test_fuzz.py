"""HTTP fuzzing of a live `bench serve` (hypothesis): generated bodies (valid, near-valid, garbage) to every route
never get a 5xx, never kill the server, and a valid request right after each case still succeeds."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine.entrypoints.serve_helpers import API_KEY, LiveServer, pid_alive, post, start_server

ROUTES = ["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize", "/reset_prefix_cache",
          "/v1/models", "/health", "/metrics", "/v1/nowhere"]  # fmt: skip
FIELDS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "n", "temperature", "top_p",
          "top_k", "min_p", "stop", "stream", "stream_options", "seed", "logprobs", "top_logprobs", "ignore_eos",
          "min_tokens", "presence_penalty", "frequency_penalty", "repetition_penalty", "stop_token_ids", "echo",
          "best_of", "logit_bias", "tokens", "add_special_tokens", "response_format", "tools", "suffix",
          "include_stop_str_in_output", "skip_special_tokens", "add_generation_prompt", "x_unknown"]  # fmt: skip

# Small and huge integers: small ones keep generations short, huge ones must be refused.
_ints = st.integers(-3, 4) | st.sampled_from([2**31, 2**63, -(2**63) - 1, 10**30])
_scalars = st.none() | st.booleans() | _ints | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                            max_size=4), max_leaves=12)
_message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", "bot", 3]),
                                  "content": st.text(max_size=20) | _json})  # fmt: skip
_values = {"prompt": st.text(max_size=30) | st.lists(_ints, max_size=6) | _json,
           "messages": st.lists(_message, max_size=3) | _json,
           "tokens": st.lists(_ints, max_size=6) | _json, "n": _ints, "max_tokens": _ints,
           "stream": st.booleans() | _json, "stream_options": st.fixed_dictionaries(
               {"include_usage": st.booleans()}) | _json}  # fmt: skip
_near_valid = st.dictionaries(st.sampled_from(FIELDS), _json, max_size=6).flatmap(
    lambda base: st.fixed_dictionaries({k: _values.get(k, _json) for k in base}).map(lambda d: {**base, **d})
)
_bodies = (
    _near_valid.map(lambda d: json.dumps(d).encode())  # near-valid objects
    | _json.map(lambda v: json.dumps(v).encode())  # any JSON value
    | st.binary(max_size=64)  # garbage bytes
    | _near_valid.map(lambda d: json.dumps(d).encode()[:-1])  # truncated
)


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    live = start_server("--api-key", API_KEY)
    yield live
    live.stop()


def _send(url: str, body: bytes, method: str) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body if method == "POST" else None, method=method,
                                     headers={"Authorization": f"Bearer {API_KEY}",
                                              "Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@pytest.mark.slow
@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(route=st.sampled_from(ROUTES), method=st.sampled_from(["POST", "POST", "GET"]), body=_bodies)
def test_fuzzed_bodies_never_get_5xx(server: LiveServer, route: str, method: str, body: bytes) -> None:
    status, answer = _send(server.url + route, body, method)
    assert status < 500, (route, body, status, answer[:300])
    if status >= 400:
        error: Any = json.loads(answer)["error"]
        assert isinstance(error["message"], str) and error["message"]
    assert server.process.poll() is None and all(pid_alive(p) for p in server.descendants())
    code, valid = post(server.url + "/v1/completions", {"prompt": "hello", "max_tokens": 1})
    assert code == 200 and valid["usage"]["completion_tokens"] == 1
