"""POST /v1/completions: OpenAI's text_completion objects, streamed or whole."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from engine.entrypoints.protocol import CompletionRequest
from engine.entrypoints.serving_engine import OpenAIServing
from engine.processor import CompletionDelta


class OpenAIServingCompletion(OpenAIServing):
    object_name = "text_completion"
    chunk_object_name = "text_completion"

    async def create(self, req: CompletionRequest, api_arrival: float) -> dict[str, Any] | AsyncIterator[bytes]:
        self.check_model(req.model)
        prompt = req.prompt
        if isinstance(prompt, str):
            request = await self.run_blocking(lambda: self.build_request("cmpl", prompt, req))
        else:
            request = self.build_request("cmpl", prompt, req)
        return await self.respond(req, request, api_arrival)

    def _logprobs(self, req: CompletionRequest, deltas: list[CompletionDelta], text_offset: int) -> Any:
        return self.completion_logprobs(deltas, text_offset) if req.logprobs is not None else None

    def full_choice(self, req: CompletionRequest, index: int, deltas: list[CompletionDelta]) -> dict[str, Any]:
        return {
            "index": index,
            "text": "".join(d.text for d in deltas),
            "logprobs": self._logprobs(req, deltas, 0),
            "finish_reason": deltas[-1].finish_reason,
            "stop_reason": deltas[-1].stop_reason,
        }

    def chunk_choice(self, req: CompletionRequest, delta: CompletionDelta, text_offset: int) -> dict[str, Any]:
        return {
            "index": delta.index,
            "text": delta.text,
            "logprobs": self._logprobs(req, [delta], text_offset),
            "finish_reason": delta.finish_reason,
            "stop_reason": delta.stop_reason,
        }
