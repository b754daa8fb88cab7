"""The streaming OpenAI client: one shared aiohttp session, a tolerant SSE parser, one record per request.

Timestamps are `time.perf_counter()` seconds. On Linux that is CLOCK_MONOTONIC, shared by every process on
the machine, so records from several client processes (`--client-procs`) sit on one clock.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from sweep.point.cancel import CancelAfter
from sweep.point.records import RequestRecord
from workloads.structured import Constraint

READ_BUFSIZE = 16 * 2**20  # aiohttp's 64 KiB default throttles long streams (vllm#39963)
SESSION_TIMEOUT_S = 6 * 3600
REQUEST_TIMEOUT_S = 6 * 3600.0  # `bench sweep --request-timeout`
STALL_TIMEOUT_S = 600.0  # `bench sweep --stall-timeout`


@dataclass
class ClientConfig:
    url: str  # base URL ending in /v1
    model: str
    endpoint: str = "completions"  # "completions" | "chat"
    api_key: str | None = None
    ignore_eos: bool = True  # synthetic prompts: outputs must run to the requested length
    temperature: float | None = None  # None: the server's default (vLLM no longer forces 0)
    request_timeout_s: float | None = REQUEST_TIMEOUT_S  # a whole request, headers to last byte; None: no limit
    stall_timeout_s: float | None = STALL_TIMEOUT_S  # longest wait for the next byte; None: no limit

    def __post_init__(self) -> None:
        if self.endpoint not in ("completions", "chat"):
            raise ValueError(f"endpoint must be 'completions' or 'chat', got {self.endpoint!r}")
        for name in ("request_timeout_s", "stall_timeout_s"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 or None (no limit), got {getattr(self, name)}")
        self.url = self.url.rstrip("/")

    @property
    def timeout(self) -> aiohttp.ClientTimeout:
        """Per request: `total` ends a request that runs too long, `sock_read` one whose stream stalls."""
        return aiohttp.ClientTimeout(total=self.request_timeout_s, sock_read=self.stall_timeout_s)

    @property
    def request_url(self) -> str:
        return f"{self.url}/chat/completions" if self.endpoint == "chat" else f"{self.url}/completions"


@dataclass
class PromptRequest:
    """One request to send: the synthesized prompt and its place on the schedule."""

    index: int
    prompt: str | None
    messages: list[dict] | None
    input_len: int  # requested (workload) lengths
    output_len: int
    intended_send_time: float = 0.0  # absolute perf_counter seconds
    constraint: Constraint | None = None  # structured output asked for (workloads/structured.py)
    request_class: str | None = None  # the workload's class of the request (per-class SLOs)
    cancel_after: CancelAfter | None = None  # `--cancel-rate`: the client aborts this request (sweep.point.cancel)


class SSEParser:
    """Incremental Server-Sent-Events parser: feed raw bytes, get complete `data` payloads.

    Network chunks may split an event anywhere or carry several events; comment lines (`:` pings),
    `event:`/`id:` fields and CRLF line endings are tolerated.
    """

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[str]:
        self._buffer += data
        if b"\r" in self._buffer:  # a CRLF split across chunks joins up here on the next feed
            self._buffer = self._buffer.replace(b"\r\n", b"\n")
        payloads: list[str] = []
        while True:
            end = self._buffer.find(b"\n\n")
            if end < 0:
                break
            event, self._buffer = self._buffer[:end], self._buffer[end + 2 :]
            lines = [line[5:].removeprefix(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
            if lines:
                payloads.append(b"\n".join(lines).decode("utf-8"))
        return payloads

    def flush(self) -> list[str]:
        """Whatever complete-looking event remains when the stream ends without a blank line."""
        rest, self._buffer = self._buffer, b""
        return self.feed(rest + b"\n\n") if rest.strip() else []


def build_payload(config: ClientConfig, request: PromptRequest) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "model": config.model,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if config.endpoint == "chat":
        payload["messages"] = request.messages or [{"role": "user", "content": request.prompt or ""}]
        payload["max_completion_tokens"] = request.output_len
    else:
        payload["prompt"] = request.prompt if request.prompt is not None else _messages_text(request.messages)
        payload["max_tokens"] = request.output_len
    if config.ignore_eos and request.constraint is None:  # a constrained output ends where its grammar does
        payload["ignore_eos"] = True
    if request.constraint is not None:
        payload.update(request.constraint.request_fields())
    if config.temperature is not None:
        payload["temperature"] = config.temperature
    return payload


def _messages_text(messages: list[dict] | None) -> str:
    return "\n".join(str(m.get("content", "")) for m in messages or [])


def _choice_text(choice: dict) -> str:
    if "text" in choice:
        return choice.get("text") or ""
    delta = choice.get("delta") or {}
    return (delta.get("content") or "") + (delta.get("reasoning_content") or delta.get("reasoning") or "")


def make_session(limit: int = 0) -> aiohttp.ClientSession:
    """One session for a whole run: keep-alive connections, a large read buffer, no per-host cap."""
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=0, keepalive_timeout=300, force_close=False)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=SESSION_TIMEOUT_S),
        read_bufsize=READ_BUFSIZE,
    )


async def send_request(session: aiohttp.ClientSession, config: ClientConfig, request: PromptRequest) -> RequestRecord:
    """Stream one request; never raises: failures land in `record.error` with their type."""
    record = RequestRecord(
        index=request.index,
        requested_input_len=request.input_len,
        requested_output_len=request.output_len,
        intended_send_time=request.intended_send_time,
    )
    headers = {"Content-Type": "application/json"}
    if config.api_key:
        headers["Authorization"] = f"Bearer {config.api_key}"
    body = json.dumps(build_payload(config, request))
    text_parts: list[str] = []
    counted_tokens = 0
    cancel = request.cancel_after
    done = False
    abort = _TimedAbort(cancel.seconds) if cancel is not None and cancel.seconds is not None else None
    record.send_time = time.perf_counter()
    try:
        if abort is not None:
            abort.arm()
        async with session.post(config.request_url, data=body, headers=headers, timeout=config.timeout) as response:
            if response.status != 200:
                detail = (await response.text())[:500]
                record.error = f"HTTPStatus {response.status}: {detail}"
                return record
            parser = SSEParser()
            # Read the body to its end, past [DONE]: leaving before the chunked terminator arrives makes aiohttp
            # close the connection, and the next request on this slot would pay a new TCP (or TLS) handshake.
            async for raw in response.content.iter_any():
                now = time.perf_counter()
                for data in parser.feed(raw):
                    if done:
                        continue  # nothing after [DONE] is part of the response
                    if data.strip() == "[DONE]":
                        done = True
                        continue
                    message = json.loads(data)
                    if "error" in message and not message.get("choices"):
                        error = message["error"]
                        detail = error.get("message", error) if isinstance(error, dict) else error
                        record.error = f"ServerError: {detail}"
                        return record
                    if isinstance(message.get("servelab"), dict):
                        record.server_timing = message["servelab"]
                    usage = message.get("usage") or None
                    if usage:
                        record.usage_prompt_tokens = usage.get("prompt_tokens")
                        record.usage_output_tokens = usage.get("completion_tokens")
                    choices = message.get("choices")
                    if not choices:
                        continue  # the trailing usage-only chunk does not advance token time (vLLM)
                    chunk_text = "".join(_choice_text(c) for c in choices)
                    text_parts.append(chunk_text)
                    if usage and usage.get("completion_tokens") is not None:
                        # Usage is cumulative: this chunk carries what it adds beyond the tokens counted so far
                        # (a server that reports usage only on its last token chunk must not count twice).
                        tokens = max(0, usage["completion_tokens"] - counted_tokens)
                    else:
                        tokens = 1 if chunk_text else 0
                    counted_tokens += tokens
                    if record.first_token_time is None:
                        record.first_token_time = now
                    record.last_token_time = now
                    record.chunk_times.append(now)
                    record.chunk_tokens.append(tokens)
                    if cancel is not None and cancel.tokens is not None and counted_tokens >= cancel.tokens:
                        response.close()  # the connection goes, so the server sees the client leave
                        record.cancelled = True
                        return record
            for data in parser.flush():
                if data.strip() != "[DONE]":
                    record.error = f"IncompleteStream: trailing unparsed event {data[:100]!r}"
    except asyncio.CancelledError:
        if abort is None or not abort.fired:
            record.error = "Cancelled: the sweep was interrupted"
            raise
        abort.absorb()  # our own --cancel-after deadline: leaving the `async with` closed the connection
        if not done:  # a deadline that fell after [DONE] aborted nothing: the request completed
            record.cancelled = True
            return record
    except asyncio.TimeoutError as e:
        record.error = timeout_reason(config, e)
        return record
    except (aiohttp.ClientError, json.JSONDecodeError, UnicodeDecodeError, OSError) as e:
        record.error = f"{type(e).__name__}: {e}"
        return record
    finally:
        if abort is not None:
            abort.disarm()
        record.generated_text = "".join(text_parts)
        if record.end_time is None:
            record.end_time = time.perf_counter()
    if record.error is None and record.first_token_time is None:
        record.error = "EmptyResponse: the stream carried no choices"
    record.success = record.error is None
    return record


class _TimedAbort:
    """`--cancel-after` a time: cancels the sending task at send + seconds; `fired` tells that cancellation apart
    from an interrupted sweep's."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.fired = False
        self._handle: asyncio.TimerHandle | None = None
        self._task: asyncio.Task | None = None

    def arm(self) -> None:
        self._task = asyncio.current_task()
        self._handle = asyncio.get_running_loop().call_later(self.seconds, self._fire)

    def _fire(self) -> None:
        self.fired = True
        if self._task is not None:
            self._task.cancel()

    def absorb(self) -> None:
        if self._task is not None:
            self._task.uncancel()

    def disarm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()


def timeout_reason(config: ClientConfig, error: asyncio.TimeoutError) -> str:
    """A request's timeout as its recorded error: `Stalled` (no byte for --stall-timeout) or `Timeout`."""
    if isinstance(error, aiohttp.ServerTimeoutError) and "connect" not in str(error).lower():
        return f"Stalled: no byte from the server for {config.stall_timeout_s:g} s (--stall-timeout)"
    return f"Timeout: no complete response within {config.request_timeout_s:g} s (--request-timeout)"


def count_tokens(records: list[RequestRecord], tokenizer: Any | None, prompts: dict[int, PromptRequest]) -> None:
    """Fill the client's re-tokenised counts and resolve `prompt_tokens`/`output_tokens` as vLLM does:
    usage when the server returned it, else the client's count (else one token per chunk)."""
    from workloads.synthesis import chat_prompt_len

    for record in records:
        prompt = prompts.get(record.index)
        if tokenizer is not None:
            record.client_output_tokens = len(tokenizer.encode(record.generated_text, add_special_tokens=False))
            if prompt is not None:
                if prompt.prompt is not None:
                    record.client_prompt_tokens = len(tokenizer.encode(prompt.prompt, add_special_tokens=False))
                else:
                    record.client_prompt_tokens = chat_prompt_len(tokenizer, prompt.messages)
        if record.usage_output_tokens:
            record.output_tokens = record.usage_output_tokens
        elif record.client_output_tokens is not None:  # vLLM: an empty re-tokenisation is 0 tokens, not 1
            record.output_tokens = record.client_output_tokens
        else:
            record.output_tokens = sum(record.chunk_tokens) or (1 if record.success else 0)
        if record.usage_prompt_tokens is not None:
            record.prompt_tokens = record.usage_prompt_tokens
        elif record.client_prompt_tokens is not None:
            record.prompt_tokens = record.client_prompt_tokens
        else:
            record.prompt_tokens = record.requested_input_len


PRECONNECT_MAX = 256


async def preconnect(session: aiohttp.ClientSession, client: ClientConfig, n: int) -> None:
    """Open up to `n` keep-alive connections with concurrent GET /models, so no measured request pays a TCP (or
    TLS) handshake inside its TTFT: a sweep measures a long-running client, not a cold start."""
    headers = {"Authorization": f"Bearer {client.api_key}"} if client.api_key else {}

    async def one() -> None:
        try:
            async with session.get(f"{client.url}/models", headers=headers, timeout=client.timeout) as response:
                await response.read()
        except (aiohttp.ClientError, asyncio.TimeoutError):
            pass  # an unreachable server shows up in the measured requests' errors

    await asyncio.gather(*(one() for _ in range(min(n, PRECONNECT_MAX))))


async def reset_prefix_cache(session: aiohttp.ClientSession, client: ClientConfig) -> bool:
    """POST /reset_prefix_cache on the server root; False when the server does not offer it or says it did not
    reset. vLLM (and `bench serve`) answer 200 with `{"success": false}` while requests still hold blocks, and vLLM
    registers the route only with VLLM_SERVER_DEV_MODE=1."""
    root = client.url.removesuffix("/v1")
    headers = {"Authorization": f"Bearer {client.api_key}"} if client.api_key else {}
    try:
        async with session.post(f"{root}/reset_prefix_cache", headers=headers, timeout=client.timeout) as response:
            if response.status != 200:
                return False
            try:
                answer = json.loads(await response.read() or b"null")
            except ValueError:
                answer = None  # a 200 without a JSON body: taken at its word
            return not (isinstance(answer, dict) and answer.get("success") is False)
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return False
