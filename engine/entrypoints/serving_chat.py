"""POST /v1/chat/completions: messages rendered with the model's own chat template; chat.completion objects
and chat.completion.chunk streams in OpenAI's shape."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from engine.entrypoints.protocol import ChatCompletionRequest, bad_request
from engine.entrypoints.serving_engine import OpenAIServing
from engine.processor import CompletionDelta


class OpenAIServingChat(OpenAIServing):
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> list[int]:
        """Chat template → token ids (the template already holds the special tokens, so none are added)."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise bad_request("this model has no chat template; use /v1/completions", "messages")
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt
            )
        except Exception as error:  # jinja raises for conversations the template refuses (role order, ...)
            raise bad_request(f"the chat template rejected these messages: {error}", "messages") from error
        return self.tokenizer.encode(text, add_special_tokens=False)

    async def create(self, req: ChatCompletionRequest, api_arrival: float) -> dict[str, Any] | AsyncIterator[bytes]:
        self.check_model(req.model)
        assert req.messages is not None
        messages = req.messages
        request = await self.run_blocking(
            lambda: self.build_request("chatcmpl", self.render_chat(messages, req.add_generation_prompt), req)
        )
        return await self.respond(req, request, api_arrival)

    def _logprobs(self, req: ChatCompletionRequest, deltas: list[CompletionDelta]) -> dict[str, Any] | None:
        return self.chat_logprobs(deltas, req.top_logprobs) if req.logprobs else None

    def full_choice(self, req: ChatCompletionRequest, index: int, deltas: list[CompletionDelta]) -> dict[str, Any]:
        return {
            "index": index,
            "message": {"role": "assistant", "content": "".join(d.text for d in deltas)},
            "logprobs": self._logprobs(req, deltas),
            "finish_reason": deltas[-1].finish_reason,
            "stop_reason": deltas[-1].stop_reason,
        }

    def opening_chunk_choices(self, n: int) -> list[dict[str, Any]]:
        """The role of each choice, before its content."""
        return [
            {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            for index in range(n)
        ]

    def chunk_choice(self, req: ChatCompletionRequest, delta: CompletionDelta, text_offset: int) -> dict[str, Any]:
        choice = {
            "index": delta.index,
            "delta": {"content": delta.text},
            "logprobs": self._logprobs(req, [delta]),
            "finish_reason": delta.finish_reason,
        }
        if delta.finished:
            choice["stop_reason"] = delta.stop_reason
        return choice
