"""POST /v1/chat/completions: messages rendered with the model's own chat template; chat.completion objects
and chat.completion.chunk streams in OpenAI's shape."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from engine.entrypoints.engine_client import RequestStream
from engine.entrypoints.protocol import ChatCompletionRequest, bad_request
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


class OpenAIServingChat(OpenAIServing):
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
        prompt_token_ids = await self.run_blocking(lambda: self.render_chat(messages, req.add_generation_prompt))
        request = self.build_request(random_id("chatcmpl"), prompt_token_ids, req.sampling_params, req.max_tokens_param)
        generation = self.generate(request, api_arrival)
        first = await start_generation(generation)
        if req.stream:
            return self._stream(req, request.request_id, len(prompt_token_ids), generation, first)
        return await self._full(req, request.request_id, len(prompt_token_ids), generation, first)

    def _logprobs(self, req: ChatCompletionRequest, deltas: list[Delta]) -> dict[str, Any] | None:
        return self.chat_logprobs(deltas, req.top_logprobs) if req.logprobs else None

    async def _full(
        self, req: ChatCompletionRequest, request_id: str, num_prompt: int, generation: Generation,
        first: tuple[Delta, RequestStream],
    ) -> dict[str, Any]:  # fmt: skip
        deltas, stream = [first[0]], first[1]
        async with aclosing(generation):
            async for delta, _ in generation:
                deltas.append(delta)
        last = deltas[-1]
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": "".join(d.text for d in deltas)},
            "logprobs": self._logprobs(req, deltas),
            "finish_reason": last.finish_reason,
            "stop_reason": last.stop_reason,
        }
        return {
            "id": request_id,
            "object": "chat.completion",
            "created": now_epoch(),
            "model": self.served_model_name,
            "choices": [choice],
            "usage": self.usage(num_prompt, sum(len(d.token_ids) for d in deltas), stream),
            "servelab": self.servelab_timing(stream),
        }

    async def _stream(
        self, req: ChatCompletionRequest, request_id: str, num_prompt: int, generation: Generation,
        first: tuple[Delta, RequestStream],
    ) -> AsyncIterator[bytes]:  # fmt: skip
        base = {"id": request_id, "object": "chat.completion.chunk", "created": now_epoch(),
                "model": self.served_model_name}  # fmt: skip
        options = req.stream_options
        num_completion = 0
        stream = first[1]

        def chunk(delta: dict[str, Any], finish_reason: str | None, stop_reason: Any, logprobs: Any) -> dict[str, Any]:
            choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
            if finish_reason is not None:
                choice["stop_reason"] = stop_reason
            body: dict[str, Any] = {**base, "choices": [choice]}
            if options.include_usage:
                continuous = options.continuous_usage_stats
                body["usage"] = self.usage(num_prompt, num_completion, None) if continuous else None
            return body

        async def deltas() -> AsyncIterator[Delta]:
            yield first[0]
            async for delta, _ in generation:
                yield delta

        # The role chunk goes out with the first engine output (after prefill), as vLLM does, so a client's
        # first-chunk TTFT still measures the first token.
        yield sse_event(chunk({"role": "assistant", "content": ""}, None, None, None))
        async with aclosing(generation):
            async for delta in deltas():
                num_completion += len(delta.token_ids)
                logprobs = self._logprobs(req, [delta])
                body = chunk({"content": delta.text}, delta.finish_reason, delta.stop_reason, logprobs)
                if delta.finish_reason is not None and not options.include_usage:
                    body["servelab"] = self.servelab_timing(stream)
                yield sse_event(body)
        if options.include_usage:
            yield sse_event(
                {**base, "choices": [], "usage": self.usage(num_prompt, num_completion, stream),
                 "servelab": self.servelab_timing(stream)}
            )  # fmt: skip
        yield SSE_DONE
