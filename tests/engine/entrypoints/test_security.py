"""The server's security knobs: the API key on every route but /health (and /metrics when asked), the request
timeout, the warning when exposed without a key, sandboxed chat templates, and no unpickling anywhere."""

from __future__ import annotations

import ast
import json
import logging
import re
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.entrypoints.api_server import ServerConfig
from engine.entrypoints.cli import is_loopback, run_server
from engine.entrypoints.protocol import ApiError
from engine.entrypoints.serving_chat import OpenAIServingChat
from tests.engine.entrypoints.serve_helpers import API_KEY, MODEL, LiveServer, post, start_server, wait_until

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    live = start_server("--api-key", API_KEY, "--metrics-require-api-key", "--request-timeout", "1.5")
    yield live
    live.stop()


def _metric(server: LiveServer, name: str) -> float:
    request = urllib.request.Request(server.url + "/metrics", headers={"Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read().decode()
    match = re.search(rf'^{re.escape(name)}\{{model_name="{MODEL}"\}} (\S+)$', text, re.MULTILINE)
    assert match, f"{name} missing from /metrics"
    return float(match.group(1))


def _get(url: str, key: str | None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_every_route_but_health_needs_the_key(server: LiveServer) -> None:
    for path in ("/v1/models", "/metrics", "/no-such-route"):
        assert _get(server.url + path, None) == 401
        assert _get(server.url + path, "wrong-key") == 401
    assert _get(server.url + "/health", None) == 200
    assert _get(server.url + "/v1/models", API_KEY) == 200 and _get(server.url + "/metrics", API_KEY) == 200
    for path in ("/tokenize", "/detokenize", "/reset_prefix_cache", "/v1/completions", "/v1/chat/completions"):
        code, answer = post(server.url + path, {}, key=None)
        assert code == 401 and answer["error"]["code"] == "invalid_api_key"


def _stalled_upload(url: str) -> tuple[bytes, float]:
    """Send headers promising 100 bytes, send 10, and wait for the server's answer."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        start = time.monotonic()
        head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n"
        sock.sendall(head.encode() + b"Content-Length: 100\r\n\r\n{\"prompt\":")
        answer = sock.recv(65536)
        return answer, time.monotonic() - start


def test_request_timeout_answers_504_to_a_stalled_upload(server: LiveServer) -> None:
    answer, waited = _stalled_upload(server.url)
    assert answer.startswith(b"HTTP/1.1 504") and b"request_timeout" in answer
    assert waited >= 1.5  # the deadline, not an early close
    assert _get(server.url + "/v1/models", API_KEY) == 200  # and the server serves on


def test_request_timeout_ends_a_long_stream_and_frees_the_engine(server: LiveServer) -> None:
    """128 completions of 250 tokens overflow the 512-block KV pool (preemption): far longer than the 1.5 s limit."""
    body = {"prompt": "hi", "n": 128, "max_tokens": 250, "ignore_eos": True, "stream": True}
    request = urllib.request.Request(server.url + "/v1/completions", data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {API_KEY}",
                                              "Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            events = [line for line in response.read().decode().splitlines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"  # the stream started: it ends with the error event, then [DONE]
        assert json.loads(events[-2].removeprefix("data: "))["error"]["code"] == "request_timeout"
    except urllib.error.HTTPError as error:  # the timeout came before the first token
        assert error.code == 504 and json.loads(error.read())["error"]["code"] == "request_timeout"
    assert wait_until(lambda: _metric(server, "vllm:num_requests_running") == 0)
    assert _metric(server, "vllm:kv_cache_usage_perc") == 0


def test_server_config_rejects_bad_timeout() -> None:
    with pytest.raises(ValueError, match="request_timeout must be > 0"):
        ServerConfig(request_timeout=0)


def test_loopback_detection() -> None:
    assert all(map(is_loopback, ("127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2")))
    assert not any(map(is_loopback, ("0.0.0.0", "::", "192.168.1.4", "example.com")))


def test_exposed_without_a_key_warns(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as taken:  # the bind fails after the warning, so no engine starts
        taken.bind(("0.0.0.0", 0))
        port = taken.getsockname()[1]
        with caplog.at_level(logging.WARNING, logger="servelab.server"):
            code = run_server({"model": "tiny-random"}, host="0.0.0.0", port=port)
        assert code == 1
        assert any("without --api-key" in r.message for r in caplog.records)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="servelab.server"):
            assert run_server({"model": "tiny-random"}, host="0.0.0.0", port=port, api_key="k") == 1
        assert not any("without --api-key" in r.message for r in caplog.records)


def test_chat_templates_render_sandboxed() -> None:
    """A template reaching for Python internals is refused (jinja's sandbox), answered as a 400."""
    from engine.tokenizer import get_tokenizer

    tokenizer = get_tokenizer("tiny-random")
    tokenizer.chat_template = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    chat = OpenAIServingChat.__new__(OpenAIServingChat)
    chat.tokenizer = tokenizer
    with pytest.raises(ApiError) as caught:
        chat.render_chat([{"role": "user", "content": "hi"}], True)
    assert caught.value.status == 400 and "unsafe" in caught.value.message.lower()
    tokenizer.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    assert tokenizer.decode(chat.render_chat([{"role": "user", "content": "hi"}], True)).strip() == "hi"


# Readers of pickled files. (pickle.loads of pipe messages between the server's own processes is multiprocessing's
# own trust model and reads no file.)
_UNPICKLERS = {("pickle", "load"), ("pickle", "Unpickler"), ("torch", "load"), ("joblib", "load"), ("dill", "load"),
               ("cloudpickle", "load"), ("pd", "read_pickle"), ("pandas", "read_pickle")}  # fmt: skip


def test_no_weights_or_results_are_unpickled() -> None:
    """Weights are safetensors/GGUF and results are JSON: no module reads a pickle file (nor np.load with pickles)."""
    found = []
    for path in REPO.glob("*/**/*.py"):
        inside = path.parts[len(REPO.parts):]
        if inside[0] in ("tests", "notebooks") or any(part.startswith(".") for part in inside):
            continue  # hidden directories hold installs (.venv, `make vllm`'s .venv-vllm), not the project
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                if isinstance(owner, ast.Name) and (owner.id, node.func.attr) in _UNPICKLERS:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}")
                if node.func.attr == "load" and any(k.arg == "allow_pickle" for k in node.keywords):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not found, found
