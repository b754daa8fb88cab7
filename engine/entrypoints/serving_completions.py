"""POST /v1/completions: OpenAI's text_completion objects, streamed or whole."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from engine.entrypoints.protocol import CompletionRequest
from engine.entrypoints.serving_engine import OpenAIServing
from engine.processor import CompletionDelta


class OpenAIServingCompletion(OpenAIServing):
    """With `echo`, each choice's text starts with the prompt (and its logprobs with the prompt's, vLLM's shape)."""

    object_name = "text_completion"
    chunk_object_name = "text_completion"

    async def create(self, req: CompletionRequest, api_arrival: float) -> dict[str, Any] | AsyncIterator[bytes]:
        self.check_model(req.model)
        prompt = req.prompt
        if isinstance(prompt, str):
            request = await self.run_blocking(lambda: self.build_request("cmpl", prompt, req))
        else:
            request = self.build_request("cmpl", prompt, req)
        req.prompt_token_ids = request.prompt_token_ids
        return await self.respond(req, request, api_arrival)

    def _logprobs(self, req: CompletionRequest, deltas: list[CompletionDelta], text_offset: int) -> Any:
        return self.completion_logprobs(deltas, text_offset) if req.logprobs is not None else None

    def full_choice(self, req: CompletionRequest, index: int, deltas: list[CompletionDelta]) -> dict[str, Any]:
        text, logprobs = "".join(d.text for d in deltas), self._logprobs(req, deltas, 0)
        if req.echo:
            prompt_ids = req.prompt_token_ids
            prompt_text = req.prompt if isinstance(req.prompt, str) else self.tokenizer.decode(prompt_ids)
            if logprobs is not None:
                prompt_logprobs = next((d.prompt_logprobs for d in deltas if d.prompt_logprobs is not None), None)
                logprobs = self.echo_logprobs(prompt_ids, prompt_logprobs, logprobs, len(prompt_text))
            text = prompt_text + text
        return {
            "index": index,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": deltas[-1].finish_reason,
            "stop_reason": deltas[-1].stop_reason,
        }

    def echo_logprobs(
        self, prompt_ids: list[int], prompt_logprobs: list | None, generated: dict[str, Any], prompt_chars: int
    ) -> dict[str, Any]:
        """The prompt's tokens (the first with logprob None, as vLLM) followed by the generated ones."""
        tokens, token_logprobs, top_logprobs, offsets, offset = [], [], [], [], 0
        for position, token_id in enumerate(prompt_ids):
            entry = prompt_logprobs[position] if prompt_logprobs is not None else None
            token = self.token_text(token_id)
            tokens.append(token)
            token_logprobs.append(entry[token_id].logprob if entry is not None else None)
            top_logprobs.append({self.token_text(t): lp.logprob for t, lp in entry.items()} if entry else None)
            offsets.append(offset)
            offset += len(token)
        return {
            "tokens": tokens + generated["tokens"],
            "token_logprobs": token_logprobs + generated["token_logprobs"],
            "top_logprobs": top_logprobs + generated["top_logprobs"],
            "text_offset": offsets + [prompt_chars + o for o in generated["text_offset"]],
        }

    def chunk_choice(self, req: CompletionRequest, delta: CompletionDelta, text_offset: int) -> dict[str, Any]:
        return {
            "index": delta.index,
            "text": delta.text,
            "logprobs": self._logprobs(req, [delta], text_offset),
            "finish_reason": delta.finish_reason,
            "stop_reason": delta.stop_reason,
        }
