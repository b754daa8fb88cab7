"""POST /v1/completions: OpenAI's text_completion objects, streamed or whole."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from engine.entrypoints.engine_client import RequestStream
from engine.entrypoints.protocol import CompletionRequest
from engine.entrypoints.serving_engine import (
    SSE_DONE,
    Delta,
    Generation,
    OpenAIServing,
    now_epoch,
    random_id,
    sse_event,
    start_generation,
)


class OpenAIServingCompletion(OpenAIServing):
    async def create(self, req: CompletionRequest, api_arrival: float) -> dict[str, Any] | AsyncIterator[bytes]:
        self.check_model(req.model)
        if isinstance(req.prompt, str):
            prompt = req.prompt
            prompt_token_ids = await self.run_blocking(lambda: self.tokenizer.encode(prompt))
        else:
            prompt_token_ids = req.prompt
            self.check_token_ids(prompt_token_ids)
        request = self.build_request(random_id("cmpl"), prompt_token_ids, req.sampling_params, req.max_tokens_param)
        generation = self.generate(request, api_arrival)
        first = await start_generation(generation)
        if req.stream:
            return self._stream(req, request.request_id, len(prompt_token_ids), generation, first)
        return await self._full(req, request.request_id, len(prompt_token_ids), generation, first)

    async def _full(
        self, req: CompletionRequest, request_id: str, num_prompt: int, generation: Generation,
        first: tuple[Delta, RequestStream],
    ) -> dict[str, Any]:  # fmt: skip
        deltas, stream = [first[0]], first[1]
        async with aclosing(generation):
            async for delta, _ in generation:
                deltas.append(delta)
        last = deltas[-1]
        num_completion = sum(len(d.token_ids) for d in deltas)
        choice = {
            "index": 0,
            "text": "".join(d.text for d in deltas),
            "logprobs": self.completion_logprobs(deltas, 0) if req.logprobs is not None else None,
            "finish_reason": last.finish_reason,
            "stop_reason": last.stop_reason,
        }
        return {
            "id": request_id,
            "object": "text_completion",
            "created": now_epoch(),
            "model": self.served_model_name,
            "choices": [choice],
            "usage": self.usage(num_prompt, num_completion, stream),
            "servelab": self.servelab_timing(stream),
        }

    async def _stream(
        self, req: CompletionRequest, request_id: str, num_prompt: int, generation: Generation,
        first: tuple[Delta, RequestStream],
    ) -> AsyncIterator[bytes]:  # fmt: skip
        created = now_epoch()
        base = {"id": request_id, "object": "text_completion", "created": created, "model": self.served_model_name}
        options = req.stream_options
        num_completion, text_offset = 0, 0
        stream = first[1]

        async def deltas() -> AsyncIterator[Delta]:
            yield first[0]
            async for delta, _ in generation:
                yield delta

        async with aclosing(generation):
            async for delta in deltas():
                num_completion += len(delta.token_ids)
                choice = {
                    "index": 0,
                    "text": delta.text,
                    "logprobs": self.completion_logprobs([delta], text_offset) if req.logprobs is not None else None,
                    "finish_reason": delta.finish_reason,
                    "stop_reason": delta.stop_reason,
                }
                text_offset += len(delta.text)
                chunk: dict[str, Any] = {**base, "choices": [choice]}
                if options.include_usage:
                    continuous = options.continuous_usage_stats
                    chunk["usage"] = self.usage(num_prompt, num_completion, None) if continuous else None
                if delta.finish_reason is not None and not options.include_usage:
                    chunk["servelab"] = self.servelab_timing(stream)
                yield sse_event(chunk)
        if options.include_usage:
            yield sse_event(
                {**base, "choices": [], "usage": self.usage(num_prompt, num_completion, stream),
                 "servelab": self.servelab_timing(stream)}
            )  # fmt: skip
        yield SSE_DONE

