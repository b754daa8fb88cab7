"""The SSE parser and the streaming client against servers that split, coalesce and fail."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from aiohttp import web

from sweep.point.client import (
    ClientConfig,
    PromptRequest,
    SSEParser,
    build_payload,
    count_tokens,
    make_session,
    reset_prefix_cache,
    send_request,
)
from sweep.run.launcher import free_port


def event(obj: dict | str) -> bytes:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()


def test_parser_split_coalesced_comments_crlf() -> None:
    stream = (
        b": ping\n\n"
        + event({"a": 1})
        + event({"b": 2})
        + b'event: x\r\ndata: {"c":\r\ndata: 3}\r\n\r\n'
        + event("[DONE]")
    )
    for cut in range(1, len(stream)):  # every split point of a two-chunk delivery
        parser = SSEParser()
        got = parser.feed(stream[:cut]) + parser.feed(stream[cut:])
        assert got == ['{"a": 1}', '{"b": 2}', '{"c":\n3}', "[DONE]"], cut
    parser = SSEParser()
    assert [p for byte in stream for p in parser.feed(bytes([byte]))][-1] == "[DONE]"  # byte by byte
    parser = SSEParser()
    assert parser.feed(b"data: [DONE]") == [] and parser.flush() == ["[DONE]"]  # no final blank line


def test_payloads() -> None:
    request = PromptRequest(0, "hi", None, 1, 7)
    completions = build_payload(ClientConfig("http://x/v1", "m"), request)
    assert completions["max_tokens"] == 7 and completions["prompt"] == "hi" and completions["ignore_eos"]
    assert completions["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    chat = build_payload(ClientConfig("http://x/v1/", "m", endpoint="chat", ignore_eos=False), request)
    assert chat["max_completion_tokens"] == 7 and chat["messages"] == [{"role": "user", "content": "hi"}]
    assert "ignore_eos" not in chat


def run_against(handler: Callable, endpoint: str = "completions", api_key: str | None = None):
    async def main():
        app = web.Application()
        app.router.add_post("/v1/completions", handler)
        app.router.add_post("/v1/chat/completions", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            config = ClientConfig(f"http://127.0.0.1:{port}/v1", "m", endpoint=endpoint, api_key=api_key)
            async with make_session() as session:
                return await send_request(session, config, PromptRequest(3, "hello world", None, 2, 4))
        finally:
            await runner.cleanup()

    return asyncio.run(main())


def chunk(text: str, usage: dict | None = None, **extra: object) -> dict:
    return {"choices": [{"index": 0, "text": text}], "usage": usage, **extra}


def test_stream_with_coalesced_chunks_and_usage() -> None:
    seen_headers = {}

    async def handler(request: web.Request) -> web.StreamResponse:
        seen_headers.update(request.headers)
        response = web.StreamResponse()
        await response.prepare(request)
        body = (
            b": keep-alive\n\n"
            + event(chunk(" a", {"prompt_tokens": 2, "completion_tokens": 1}))
            + event(chunk(" b c", {"prompt_tokens": 2, "completion_tokens": 3}))  # two tokens in one chunk
        )
        await response.write(body[:17])  # split inside the first event
        await asyncio.sleep(0.01)
        await response.write(body[17:])
        await asyncio.sleep(0.01)
        timing = {"arrival_time": 1.0, "first_scheduled_time": 1.5, "first_token_time": 2.0}
        final = {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 3}, "servelab": timing}
        await response.write(event(final) + event("[DONE]"))
        return response

    r = run_against(handler, api_key="sk-test")
    assert seen_headers["Authorization"] == "Bearer sk-test"
    assert r.success and r.error is None and r.index == 3
    assert r.chunk_tokens == [1, 2] and len(r.chunk_times) == 2
    assert r.first_token_time == r.chunk_times[0] and r.last_token_time == r.chunk_times[1]
    assert r.send_time <= r.first_token_time <= r.last_token_time <= r.end_time
    assert r.itl == [r.chunk_times[1] - r.chunk_times[0]]
    assert r.server_timing["first_scheduled_time"] == 1.5
    assert r.generated_text == " a b c"
    count_tokens([r], None, {})
    assert (r.output_tokens, r.prompt_tokens) == (3, 2)  # usage wins


def test_chat_stream_without_usage_counts_chunks() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for i, text in enumerate(["x", "", "y"]):
            delta = {"role": "assistant", "content": text} if i == 0 else {"content": text}
            await response.write(event({"choices": [{"index": 0, "delta": delta}]}))
        await response.write(event("[DONE]"))
        return response

    r = run_against(handler, endpoint="chat")
    assert r.success and r.chunk_tokens == [1, 0, 1]  # an empty delta carries no token
    count_tokens([r], None, {})
    assert r.output_tokens == 2 and r.prompt_tokens == 2  # no usage, no tokenizer: chunks, requested length


def test_failures_are_recorded_not_raised() -> None:
    async def http_error(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "too long"}}, status=400)

    r = run_against(http_error)
    assert not r.success and r.error.startswith("HTTPStatus 400") and "too long" in r.error

    async def stream_error(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(event({"error": {"message": "engine died"}}))
        return response

    r = run_against(stream_error)
    assert not r.success and r.error == "ServerError: engine died"

    async def empty(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(event("[DONE]"))
        return response

    r = run_against(empty)
    assert not r.success and r.error.startswith("EmptyResponse")

    async def refused() -> None:
        async with make_session() as session:
            return await send_request(
                session, ClientConfig(f"http://127.0.0.1:{free_port()}/v1", "m"), PromptRequest(0, "x", None, 1, 1)
            )

    r = asyncio.run(refused())
    assert not r.success and "Connect" in r.error and r.end_time is not None


def test_usage_only_on_the_last_token_chunk_is_not_counted_twice() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(event(chunk(" a")) + event(chunk(" b")))
        await response.write(event(chunk(" c", {"prompt_tokens": 2, "completion_tokens": 3})))  # cumulative, once
        await response.write(event("[DONE]"))
        return response

    r = run_against(handler)
    assert r.chunk_tokens == [1, 1, 1]  # the old client made it [1, 1, 3]: 5 tokens for 3
    assert sum(r.chunk_tokens) == r.usage_output_tokens == 3


def test_empty_retokenisation_is_zero_tokens_as_in_vllm() -> None:
    class Tokenizer:
        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            return [0] * len(text.split())

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(event(chunk("")) + event("[DONE]"))  # a special token: a choice with no text
        return response

    r = run_against(handler)
    assert r.success
    count_tokens([r], Tokenizer(), {})
    assert r.client_output_tokens == 0 and r.output_tokens == 0  # vLLM: len(tokenizer("")) = 0, not 1


class _CountingChunkedServer(asyncio.Protocol):
    """A raw HTTP/1.1 server that sends [DONE] and then, `lag_s` later, the chunked body's terminator."""

    connections = 0

    def __init__(self, lag_s: float) -> None:
        self.lag_s = lag_s
        self.buffer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        type(self).connections += 1
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        head_end = self.buffer.find(b"\r\n\r\n")
        if head_end < 0:
            return
        head = self.buffer[:head_end].lower().split(b"\r\n")
        length = int(next((line.split(b":")[1] for line in head if line.startswith(b"content-length")), b"0"))
        if len(self.buffer) < head_end + 4 + length:
            return
        self.buffer = self.buffer[head_end + 4 + length :]
        asyncio.get_running_loop().create_task(self.respond())

    async def respond(self) -> None:
        self.transport.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for payload in (event(chunk(" a", {"prompt_tokens": 1, "completion_tokens": 1})), event("[DONE]")):
            self.transport.write(f"{len(payload):x}\r\n".encode() + payload + b"\r\n")
        await asyncio.sleep(self.lag_s)
        self.transport.write(b"0\r\n\r\n")


def test_keep_alive_holds_when_the_body_ends_after_done() -> None:
    async def main() -> int:
        _CountingChunkedServer.connections = 0
        port = free_port()
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _CountingChunkedServer(0.002), "127.0.0.1", port)
        async with server:
            config = ClientConfig(f"http://127.0.0.1:{port}/v1", "m")
            async with make_session() as session:
                for i in range(40):
                    record = await send_request(session, config, PromptRequest(i, "x", None, 1, 1))
                    assert record.success, record.error
        return _CountingChunkedServer.connections

    assert asyncio.run(main()) == 1  # reading only to [DONE] opened one connection per request


def test_prefix_cache_reset_reads_the_servers_answer_not_only_its_status() -> None:
    """vLLM and `bench serve` answer 200 with {"success": false} when blocks are still in use: not a reset."""

    async def reset_with(response: web.Response | None) -> bool:
        app = web.Application()
        if response is not None:
            app.router.add_post("/reset_prefix_cache", lambda request: response)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            async with make_session() as session:
                return await reset_prefix_cache(session, ClientConfig(f"http://127.0.0.1:{port}/v1", "m"))
        finally:
            await runner.cleanup()

    assert asyncio.run(reset_with(web.json_response({"success": True}))) is True
    assert asyncio.run(reset_with(web.json_response({"success": False}))) is False
    assert asyncio.run(reset_with(web.Response(status=200))) is True  # no body: taken at its word
    assert asyncio.run(reset_with(web.json_response({"error": "no"}, status=500))) is False
    assert asyncio.run(reset_with(None)) is False  # the route does not exist (vLLM without VLLM_SERVER_DEV_MODE)
