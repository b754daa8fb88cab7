"""`bench mock-server`: an OpenAI-compatible server that streams on a programmed schedule.

Each request's first token leaves `ttft_ms` after the request arrives and token k (0-based) leaves at
`ttft_ms + k * itl_ms`, on an absolute schedule so timer slack does not accumulate. Output length is
`max_tokens` (or `max_completion_tokens`), capped by `output_len` when that is set. It serves
/v1/completions and /v1/chat/completions (streaming or not), /v1/models, /health and /reset_prefix_cache,
returns usage (and per-chunk usage with `stream_options.continuous_usage_stats`), and a `servelab` timing
field shaped like the built-in server's, so the client's TTFT decomposition can be tested.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass

from aiohttp import web

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

    def __post_init__(self) -> None:
        if self.ttft_ms < 0 or self.itl_ms < 0:
            raise ValueError("ttft_ms and itl_ms must be >= 0")
        if self.tokens_per_chunk < 1:
            raise ValueError(f"tokens_per_chunk must be >= 1, got {self.tokens_per_chunk}")
        if self.output_len is not None and self.output_len < 1:
            raise ValueError(f"output_len must be >= 1, got {self.output_len}")


async def _sleep_until(deadline: float) -> None:
    delay = deadline - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


def _num_prompt_tokens(body: dict) -> int:
    if "prompt" in body:
        prompt = body["prompt"]
        return len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
    return sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))


class MockServer:
    def __init__(self, config: MockConfig) -> None:
        self.config = config
        self.num_requests = 0
        self.num_resets = 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.config.model, "object": "model"}]})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        self.num_resets += 1
        return web.Response(text="")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        arrival = time.perf_counter()
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return web.json_response({"error": {"message": "body is not JSON"}}, status=400)
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 16
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return web.json_response({"error": {"message": f"max_tokens must be >= 1, got {max_tokens}"}}, status=400)
        self.num_requests += 1
        cfg = self.config
        n = min(max_tokens, cfg.output_len) if cfg.output_len else max_tokens
        prompt_tokens = _num_prompt_tokens(body)
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        first_token_at = arrival + cfg.ttft_ms / 1000.0
        timing = {
            "arrival_time": arrival,
            "first_scheduled_time": arrival,
            "first_token_time": first_token_at,
            "finished_time": first_token_at + (n - 1) * cfg.itl_ms / 1000.0,
            "num_preemptions": 0,
            "num_cached_tokens": 0,
        }
        if not body.get("stream"):
            await _sleep_until(timing["finished_time"])
            text = TOKEN_TEXT * n
            choice = {"index": 0, "finish_reason": "length"}
            choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
            return web.json_response(
                {
                    "id": request_id,
                    "object": "chat.completion" if chat else "text_completion",
                    "model": cfg.model,
                    "choices": [choice],
                    "usage": _usage(prompt_tokens, n),
                    "servelab": timing,
                }
            )
        options = body.get("stream_options") or {}
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        sent = 0
        while sent < n:
            await _sleep_until(first_token_at + (sent + cfg.tokens_per_chunk - 1) * cfg.itl_ms / 1000.0)
            count = min(cfg.tokens_per_chunk, n - sent)
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
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        if options.get("include_usage"):
            final = {"id": request_id, "model": cfg.model, "choices": [], "usage": _usage(prompt_tokens, n)}
            await response.write(f"data: {json.dumps(final)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def serve(config: MockConfig) -> None:
    """Run until interrupted (SIGINT/SIGTERM)."""
    web.run_app(MockServer(config).app(), host=config.host, port=config.port, print=None, access_log=None)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="OpenAI-compatible mock server with programmed timing")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--itl-ms", type=float, default=10.0)
    parser.add_argument("--output-len", type=int, default=None)
    parser.add_argument("--tokens-per-chunk", type=int, default=1)
    args = parser.parse_args()
    serve(MockConfig(**{k: v for k, v in vars(args).items()}))
