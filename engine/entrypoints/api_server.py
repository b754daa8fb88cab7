"""The OpenAI-compatible HTTP server: aiohttp routes, auth/limit/error middleware, start-up and graceful shutdown.

The engine loop runs in its own process (engine_process.py); this process only parses, tokenises, renders chat
templates, detokenises and writes bytes, so a slow client or a long prefill never stalls another stream.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from engine.entrypoints.engine_client import EngineClient, engine_dead_error
from engine.entrypoints.prometheus import CONTENT_TYPE, ServerMetrics
from engine.entrypoints.protocol import ApiError, bad_request, parse_chat_request, parse_completion_request
from engine.entrypoints.serving_chat import OpenAIServingChat
from engine.entrypoints.serving_completions import OpenAIServingCompletion
from engine.entrypoints.serving_engine import SSE_DONE, sse_event

logger = logging.getLogger("servelab.server")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# With an API key set, every path needs it except these (and /metrics unless metrics_require_api_key).
_OPEN_PATHS = ("/health",)
# Paths that need a live engine.
_ENGINE_PATHS = ("/v1/completions", "/v1/chat/completions", "/reset_prefix_cache")


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    served_model_name: str | None = None  # default: the --model value
    max_request_bytes: int = 16 * 1024 * 1024
    shutdown_timeout: float = 5.0  # seconds in-flight requests get to finish on SIGINT/SIGTERM
    metrics_require_api_key: bool = False  # with api_key: /metrics needs it too
    request_timeout: float | None = None  # seconds a request may take, body read to last byte (None: no limit)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.max_request_bytes < 1024:
            raise ValueError(f"max_request_bytes must be >= 1024, got {self.max_request_bytes}")
        if self.shutdown_timeout < 0:
            raise ValueError(f"shutdown_timeout must be >= 0, got {self.shutdown_timeout}")
        if self.request_timeout is not None and self.request_timeout <= 0:
            raise ValueError(f"request_timeout must be > 0 (or unset), got {self.request_timeout}")


def error_response(error: ApiError) -> web.Response:
    return web.json_response(error.to_body(), status=error.status)


class Server:
    def __init__(self, engine: EngineClient, tokenizer: Any, config: ServerConfig, metrics: ServerMetrics) -> None:
        assert engine.info is not None
        self.engine = engine
        self.config = config
        self.metrics = metrics
        self.model_name = config.served_model_name or engine.info.model
        # One worker shared by all endpoints: an HF tokenizer is not safe to use from two threads at once.
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="servelab-tokenizer")
        self.completions = OpenAIServingCompletion(engine, tokenizer, self.model_name, executor)
        self.chat = OpenAIServingChat(engine, tokenizer, self.model_name, executor)
        self.tokenizer = tokenizer
        self.created = int(time.time())
        self.shutting_down = False
        self.num_handlers = 0  # generation handlers still running
        self.app = self._build_app()

    def _build_app(self) -> web.Application:
        app = web.Application(
            client_max_size=self.config.max_request_bytes,
            middlewares=[self._error_middleware, self._gate_middleware],
        )
        app.router.add_post("/v1/completions", self.create_completion)
        app.router.add_post("/v1/chat/completions", self.create_chat_completion)
        app.router.add_get("/v1/models", self.show_models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.show_metrics)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        return app

    # ------------------------------------------------------------------------------------------- middleware

    @web.middleware
    async def _error_middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as error:
            return error_response(error)
        except web.HTTPRequestEntityTooLarge:
            limit = self.config.max_request_bytes
            return error_response(ApiError(413, f"the request body exceeds the {limit}-byte limit",
                                           code="request_too_large"))  # fmt: skip
        except web.HTTPNotFound:
            return error_response(ApiError(404, f"Invalid URL ({request.method} {request.path})", code="unknown_url"))
        except web.HTTPMethodNotAllowed as error:
            return error_response(ApiError(405, f"Method {request.method} not allowed for {request.path}; "
                                                f"use {', '.join(sorted(error.allowed_methods))}"))  # fmt: skip
        except web.HTTPException as error:
            return error_response(ApiError(error.status, error.reason))
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception:
            logger.exception("unhandled error on %s %s", request.method, request.path)
            return error_response(ApiError(500, "internal server error", type="server_error"))

    @web.middleware
    async def _gate_middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """API key first, then whether the engine can take the request."""
        key = self.config.api_key
        open_paths = _OPEN_PATHS if self.config.metrics_require_api_key else (*_OPEN_PATHS, "/metrics")
        if key is not None and request.path not in open_paths:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
                what = "Incorrect API key provided." if given else "Missing API key: send 'Authorization: Bearer KEY'."
                raise ApiError(401, what, code="invalid_api_key")
        if request.path in _ENGINE_PATHS:
            if self.engine.dead:
                raise engine_dead_error()
            if self.shutting_down:
                raise ApiError(503, "the server is shutting down", type="server_error", code="shutting_down")
        if self.config.request_timeout is None:
            return await handler(request)
        try:
            async with asyncio.timeout(self.config.request_timeout):
                return await handler(request)
        except TimeoutError:
            return await self._timed_out(request)

    async def _timed_out(self, request: web.Request) -> web.StreamResponse:
        """504, or, for a stream already under way, an error event ending it (the engine request is aborted)."""
        error = ApiError(504, f"the request took longer than the server's {self.config.request_timeout} s "
                         "request timeout", type="server_error", code="request_timeout")  # fmt: skip
        response: web.StreamResponse | None = request.get("stream_response")
        if response is None:
            return error_response(error)
        await response.write(sse_event(error.to_body()))
        await response.write(SSE_DONE)
        await response.write_eof()
        return response

    async def _json_body(self, request: web.Request) -> Any:
        length = request.content_length
        if length is not None and length > self.config.max_request_bytes:
            raise web.HTTPRequestEntityTooLarge(max_size=self.config.max_request_bytes, actual_size=length)
        raw = await request.read()
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise bad_request(f"the request body is not valid JSON: {error}") from error

    # ------------------------------------------------------------------------------------------- generation

    async def create_completion(self, request: web.Request) -> web.StreamResponse:
        arrival = time.monotonic()
        parsed = parse_completion_request(await self._json_body(request))
        return await self._respond(request, self.completions.create(parsed, arrival))

    async def create_chat_completion(self, request: web.Request) -> web.StreamResponse:
        arrival = time.monotonic()
        parsed = parse_chat_request(await self._json_body(request))
        return await self._respond(request, self.chat.create(parsed, arrival))

    async def _respond(
        self, request: web.Request, result: Awaitable[dict[str, Any] | AsyncIterator[bytes]]
    ) -> web.StreamResponse:
        self.num_handlers += 1
        try:
            body = await result
            if isinstance(body, dict):
                return web.json_response(body)
            return await self._stream(request, body)
        finally:
            self.num_handlers -= 1

    async def _stream(self, request: web.Request, body: AsyncIterator[bytes]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        request["stream_response"] = response
        try:
            async with aclosing(body):  # type: ignore[type-var]
                async for chunk in body:
                    await response.write(chunk)
        except ApiError as error:  # the engine died or the server is stopping: end the stream with the error
            await response.write(sse_event(error.to_body()))
            await response.write(SSE_DONE)
        except ConnectionResetError:
            return response  # the client left; aclosing already aborted the request in the engine
        await response.write_eof()
        return response

    # ------------------------------------------------------------------------------------------- other routes

    async def show_models(self, request: web.Request) -> web.Response:
        assert self.engine.info is not None
        card = {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "servelab",
                "root": self.engine.info.model, "parent": None, "max_model_len": self.engine.info.max_model_len}
        return web.json_response({"object": "list", "data": [card]})  # fmt: skip

    async def health(self, request: web.Request) -> web.Response:
        if self.engine.dead:
            return error_response(engine_dead_error())
        return web.Response(status=200)

    async def show_metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await self._json_body(request)
        if not isinstance(body, dict):
            raise bad_request("the request body must be a JSON object")
        self.completions.check_model(body.get("model"))
        if "messages" in body:
            parsed = parse_chat_request({"messages": body["messages"],
                                         "add_generation_prompt": body.get("add_generation_prompt", True)})  # fmt: skip
            assert parsed.messages is not None
            messages = parsed.messages
            tokens = await self.chat.run_blocking(lambda: self.chat.render_chat(messages, parsed.add_generation_prompt))
        else:
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                raise bad_request("'prompt' must be a string (or send 'messages')", "prompt")
            add_special = body.get("add_special_tokens", True)
            if not isinstance(add_special, bool):
                raise bad_request("'add_special_tokens' must be a boolean", "add_special_tokens")
            tokens = await self.chat.run_blocking(lambda: self.tokenizer.encode(prompt, add_special_tokens=add_special))
        assert self.engine.info is not None
        return web.json_response({"count": len(tokens), "max_model_len": self.engine.info.max_model_len,
                                  "tokens": tokens})  # fmt: skip

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await self._json_body(request)
        if not isinstance(body, dict):
            raise bad_request("the request body must be a JSON object")
        self.completions.check_model(body.get("model"))
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or any(isinstance(t, bool) or not isinstance(t, int) for t in tokens):
            raise bad_request("'tokens' must be a list of token ids", "tokens")
        self.completions.check_token_ids(tokens, "tokens")
        return web.json_response({"prompt": self.tokenizer.decode(tokens)})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        success = await self.engine.call_utility("reset_prefix_cache")
        if not success:
            raise ApiError(409, "the prefix cache cannot be reset while requests are running; retry when idle",
                           code="engine_busy")  # fmt: skip
        return web.json_response({"success": True})

    # ------------------------------------------------------------------------------------------- shutdown

    async def drain(self) -> None:
        """Stop taking requests, give in-flight ones `shutdown_timeout` seconds, then end the rest with 503."""
        self.shutting_down = True
        deadline = time.monotonic() + self.config.shutdown_timeout
        while self.num_handlers and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.num_handlers:
            logger.info("ending %d in-flight request(s)", self.num_handlers)
            self.engine.fail_all(ApiError(503, "the server is shutting down", type="server_error",
                                          code="shutting_down"))  # fmt: skip
            deadline = time.monotonic() + 5.0
            while self.num_handlers and time.monotonic() < deadline:
                await asyncio.sleep(0.05)


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind now (fail fast if the port is taken) but listen only once the engine is ready."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise OSError(f"cannot bind {host}:{port}: {error.strerror or error}") from error
    return sock


async def serve(server: Server, sock: socket.socket, startup_line: str) -> None:
    """Serve until SIGINT/SIGTERM, then drain and close."""
    loop = asyncio.get_running_loop()
    server.engine.attach(loop)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    runner = web.AppRunner(server.app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.SockSite(runner, sock)
    await site.start()
    print(startup_line, file=sys.stderr, flush=True)  # always shown, whatever the log level: launchers read it
    await stop.wait()
    logger.info("shutting down")
    await server.drain()
    await runner.cleanup()
