"""`bench lab mock-server`: an OpenAI-compatible server that streams on a programmed schedule.

Each request's first token leaves `ttft_ms` after the request arrives and token k (0-based) leaves at
`ttft_ms + k * itl_ms`, on an absolute schedule so timer slack does not accumulate. Output length is
`max_tokens` (or `max_completion_tokens`), capped by `output_len` when that is set. It serves
/v1/completions and /v1/chat/completions (streaming or not), /v1/models, /health, /reset_prefix_cache and
/metrics (requests running, prompt and generated tokens under vLLM's names),
returns usage (and per-chunk usage with `stream_options.continuous_usage_stats`), and a `servelab` timing
field shaped like the built-in server's, so the client's TTFT decomposition can be tested.
A client that closes its connection mid-response (`bench sweep --cancel-rate`) stops that response's generation
at once (counted in `num_aborted`).
With `hang_after_tokens` N, every response stops after N tokens and stays open, sending nothing more (a non-streamed
one never answers), while /health keeps answering: a stalled engine, for the client's timeouts.

With `max_num_seqs` N (vLLM's name), at most N requests run at once; later ones wait in a FIFO queue, and a
request's TTFT schedule starts when it leaves the queue (`first_scheduled_time` in its timing). The mock then has a
known capacity: N / (ttft_ms + (n - 1) * itl_ms) * 1000 requests/s for n-token outputs (`capacity_rps`), so
tests can offer a load above or below it (the saturation detector's tests do).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
from dataclasses import dataclass

TOKEN_TEXT = " hello"


@dataclass
class MockConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    ttft_ms: float = 50.0
    itl_ms: float = 10.0
    output_len: int | None = None  # cap on tokens per request; None: max_tokens decides
    tokens_per_chunk: int = 1  # >1 coalesces tokens into one SSE event, like spec decode or stream intervals
    model: str = "mock"
    hang_after_tokens: int | None = None  # every response goes silent after this many tokens
    max_num_seqs: int | None = None  # at most this many requests run at once; the rest queue (FIFO)

    def __post_init__(self) -> None:
        if self.ttft_ms < 0 or self.itl_ms < 0:
            raise ValueError("ttft_ms and itl_ms must be >= 0")
        if self.tokens_per_chunk < 1:
            raise ValueError(f"tokens_per_chunk must be >= 1, got {self.tokens_per_chunk}")
        if self.output_len is not None and self.output_len < 1:
            raise ValueError(f"output_len must be >= 1, got {self.output_len}")
        if self.hang_after_tokens is not None and self.hang_after_tokens < 0:
            raise ValueError(f"hang_after_tokens must be >= 0, got {self.hang_after_tokens}")
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")

    def capacity_rps(self, output_len: int) -> float:
        """Requests/s the mock can complete with `max_num_seqs` slots and `output_len`-token outputs (inf without
        a slot limit): each request holds a slot for ttft + (output_len - 1) * itl."""
        service_s = (self.ttft_ms + (output_len - 1) * self.itl_ms) / 1000.0
        if self.max_num_seqs is None or service_s <= 0:
            return float("inf")
        return self.max_num_seqs / service_s


# asyncio's epoll waits round timeouts up to whole milliseconds, so a timer fires 0-1 ms late (0.5 ms on
# average); aiming half a millisecond early centres each emission on its programmed time.
TIMER_CENTRING_S = 0.0005


async def _sleep_until(deadline: float) -> None:
    # Always yields, even when already due, so zero-gap streams interleave instead of bursting.
    await asyncio.sleep(max(0.0, deadline - time.perf_counter() - TIMER_CENTRING_S))


async def _hang() -> None:
    """Wait until the client goes away (the connection's loss cancels the request's task)."""
    await asyncio.get_running_loop().create_future()


def _num_prompt_tokens(body: dict) -> int:
    if "prompt" in body:
        prompt = body["prompt"]
        return len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
    return sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))


class MockServer:
    """Request handling; `protocol()` serves it over a minimal HTTP/1.1 keep-alive protocol.

    Plain asyncio instead of aiohttp.web: one transport.write per SSE event keeps the mock's own cost per
    streamed chunk several times lower, so at hundreds of streams the client, not the mock, is measured.
    """

    def __init__(self, config: MockConfig) -> None:
        self.config = config
        self.num_requests = 0
        self.num_resets = 0
        self.num_running = 0  # /metrics, under vLLM's names: what the mock really did, nothing simulated
        self.num_waiting = 0  # queued for one of `max_num_seqs` slots
        self.slots = asyncio.Semaphore(config.max_num_seqs) if config.max_num_seqs else None
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.num_aborted = 0  # requests whose client went away mid-response: their generation stopped there

    def protocol(self) -> _HttpConnection:
        return _HttpConnection(self)

    async def handle(self, conn: _HttpConnection, method: str, path: str, body: bytes, arrival: float) -> None:
        path = path.split("?", 1)[0]
        if method == "GET" and path == "/health":
            conn.respond(200, b"")
        elif method == "GET" and path == "/v1/models":
            conn.respond_json(200, {"object": "list", "data": [{"id": self.config.model, "object": "model"}]})
        elif method == "GET" and path == "/metrics":
            conn.respond(200, self.metrics_text().encode(), "text/plain; version=0.0.4")
        elif method == "POST" and path == "/reset_prefix_cache":
            self.num_resets += 1
            conn.respond(200, b"")
        elif method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            await self.generate(conn, body, arrival, chat=path.endswith("chat/completions"))
        else:
            conn.respond_json(404, {"error": {"message": f"no route {method} {path}"}})

    def metrics_text(self) -> str:
        """Prometheus text: requests in flight, prompt and generated tokens (counted when a request ends)."""
        model = f'model_name="{self.config.model}"'
        return (
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{{{model}}} {self.num_running}\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{{{model}}} {self.num_waiting}\n"
            "# TYPE vllm:prompt_tokens counter\n"
            f"vllm:prompt_tokens_total{{{model}}} {self.prompt_tokens}\n"
            "# TYPE vllm:generation_tokens counter\n"
            f"vllm:generation_tokens_total{{{model}}} {self.generation_tokens}\n"
        )

    async def generate(self, conn: _HttpConnection, raw: bytes, arrival: float, chat: bool) -> None:
        if self.slots is None:
            await self._run(conn, raw, arrival, arrival, chat)
            return
        self.num_waiting += 1
        try:
            await self.slots.acquire()  # asyncio's semaphore wakes its waiters in FIFO order
        finally:
            self.num_waiting -= 1
        try:
            await self._run(conn, raw, arrival, time.perf_counter(), chat)
        finally:
            self.slots.release()

    async def _run(self, conn: _HttpConnection, raw: bytes, arrival: float, scheduled: float, chat: bool) -> None:
        self.num_running += 1
        try:
            await self._generate(conn, raw, arrival, scheduled, chat)
        except asyncio.CancelledError:  # the connection was lost (connection_lost cancels this task)
            self.num_aborted += 1
            raise
        finally:
            self.num_running -= 1

    async def _generate(self, conn: _HttpConnection, raw: bytes, arrival: float, scheduled: float, chat: bool) -> None:
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            conn.respond_json(400, {"error": {"message": "body is not JSON"}})
            return
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        max_tokens = 16 if max_tokens is None else max_tokens
        if not isinstance(max_tokens, int) or max_tokens < 1:
            conn.respond_json(400, {"error": {"message": f"max_tokens must be >= 1, got {max_tokens}"}})
            return
        self.num_requests += 1
        cfg = self.config
        n = min(max_tokens, cfg.output_len) if cfg.output_len else max_tokens
        prompt_tokens = _num_prompt_tokens(body)
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        first_token_at = scheduled + cfg.ttft_ms / 1000.0
        timing = {
            "arrival_time": arrival,
            "first_scheduled_time": scheduled,
            "first_token_time": first_token_at,
            "finished_time": first_token_at + (n - 1) * cfg.itl_ms / 1000.0,
            "num_preemptions": 0,
            "num_cached_tokens": 0,
        }
        if not body.get("stream"):
            if cfg.hang_after_tokens is not None:
                await _hang()
            await _sleep_until(timing["finished_time"])
            text = TOKEN_TEXT * n
            choice = {"index": 0, "finish_reason": "length"}
            choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
            conn.respond_json(
                200,
                {
                    "id": request_id,
                    "object": "chat.completion" if chat else "text_completion",
                    "model": cfg.model,
                    "choices": [choice],
                    "usage": _usage(prompt_tokens, n),
                    "servelab": timing,
                },
            )
            self.prompt_tokens += prompt_tokens
            self.generation_tokens += n
            return
        options = body.get("stream_options") or {}
        conn.start_stream()
        sent = 0
        while sent < n:
            if cfg.hang_after_tokens is not None and sent >= cfg.hang_after_tokens:
                await _hang()
            await _sleep_until(first_token_at + (sent + cfg.tokens_per_chunk - 1) * cfg.itl_ms / 1000.0)
            count = min(cfg.tokens_per_chunk, n - sent)
            if cfg.hang_after_tokens is not None:
                count = min(count, cfg.hang_after_tokens - sent)
            sent += count
            text = TOKEN_TEXT * count
            finish = "length" if sent == n else None
            if chat:
                delta = {"content": text} if sent > count else {"role": "assistant", "content": text}
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text, "finish_reason": finish}
            chunk: dict = {
                "id": request_id,
                "object": "chat.completion.chunk" if chat else "text_completion",
                "model": cfg.model,
                "choices": [choice],
            }
            if options.get("continuous_usage_stats"):
                chunk["usage"] = _usage(prompt_tokens, sent)
            if sent == n:
                chunk["servelab"] = timing
            conn.send_event(json.dumps(chunk))
        if options.get("include_usage"):
            conn.send_event(
                json.dumps({"id": request_id, "model": cfg.model, "choices": [], "usage": _usage(prompt_tokens, n)})
            )
        conn.send_event("[DONE]")
        conn.end_stream()
        self.prompt_tokens += prompt_tokens
        self.generation_tokens += n


class _HttpConnection(asyncio.Protocol):
    """HTTP/1.1 with keep-alive, Content-Length request bodies and chunked streaming responses."""

    def __init__(self, server: MockServer) -> None:
        self.server = server
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.task: asyncio.Task | None = None
        self.close_after = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.task is not None:
            self.task.cancel()
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._next_request()

    def _next_request(self) -> None:
        if self.task is not None or self.transport is None:
            return
        head_end = self.buffer.find(b"\r\n\r\n")
        if head_end < 0:
            return
        lines = self.buffer[:head_end].decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        if len(self.buffer) < head_end + 4 + length:
            return
        arrival = time.perf_counter()
        body = self.buffer[head_end + 4 : head_end + 4 + length]
        self.buffer = self.buffer[head_end + 4 + length :]
        method, path, *_ = lines[0].split(" ")
        self.close_after = headers.get("connection", "").lower() == "close"
        self.task = asyncio.get_running_loop().create_task(self.server.handle(self, method, path, body, arrival))
        self.task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self.task = None
        if not task.cancelled() and task.exception() is not None and self.transport is not None:
            self.transport.close()
            return
        if self.close_after and self.transport is not None:
            self.transport.close()
            return
        self._next_request()

    def _write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def respond(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
        head = f"HTTP/1.1 {status} {_REASONS.get(status, 'OK')}\r\nContent-Type: {content_type}\r\n"
        self._write(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)

    def respond_json(self, status: int, value: dict) -> None:
        self.respond(status, json.dumps(value).encode(), "application/json")

    def start_stream(self) -> None:
        self._write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )

    def send_event(self, data: str) -> None:
        event = f"data: {data}\n\n".encode()
        self._write(f"{len(event):x}\r\n".encode() + event + b"\r\n")

    def end_stream(self) -> None:
        self._write(b"0\r\n\r\n")


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found"}


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def serve(config: MockConfig, workers: int = 1) -> None:
    """Run until SIGINT/SIGTERM. `workers` > 1 forks processes sharing the port (SO_REUSEPORT)."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    children = []
    for _ in range(workers - 1):
        pid = os.fork()
        if pid == 0:
            asyncio.run(_serve_forever(config, reuse_port=True))
            os._exit(0)
        children.append(pid)
    try:
        asyncio.run(_serve_forever(config, reuse_port=workers > 1))
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


async def _serve_forever(config: MockConfig, reuse_port: bool) -> None:
    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
    mock = MockServer(config)
    server = await loop.create_server(mock.protocol, config.host, config.port, reuse_port=reuse_port, backlog=4096)
    async with server:
        await stop


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="OpenAI-compatible mock server with programmed timing")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--itl-ms", type=float, default=10.0)
    parser.add_argument("--output-len", type=int, default=None)
    parser.add_argument("--tokens-per-chunk", type=int, default=1)
    parser.add_argument("--hang-after-tokens", type=int, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--workers", type=int, default=1)
    args = vars(parser.parse_args())
    workers = args.pop("workers")
    serve(MockConfig(**args), workers=workers)
