"""What both OpenAI endpoints share: model checks, prompt limits, the per-request generation loop with
incremental detokenisation and stop strings (in the API process), logprob and timing formatting, SSE framing."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from engine.detokenizer import IncrementalDetokenizer
from engine.entrypoints.engine_client import EngineClient, RequestStream
from engine.entrypoints.protocol import ApiError, bad_request
from engine.outputs import Logprob
from engine.request import Request
from engine.sampling_params import SamplingParams

T = TypeVar("T")

SSE_DONE = b"data: [DONE]\n\n"


def sse_event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


@dataclass
class Delta:
    """What one engine output adds to a response, after detokenisation and stop-string handling."""

    text: str
    token_ids: list[int]
    logprobs: list[list[Logprob]] | None
    finish_reason: str | None
    stop_reason: int | str | None


class OpenAIServing:
    def __init__(
        self, engine: EngineClient, tokenizer: Any, served_model_name: str, executor: ThreadPoolExecutor
    ) -> None:
        assert engine.info is not None, "start the engine before serving"
        self.engine = engine
        self.info = engine.info
        self.tokenizer = tokenizer
        self.served_model_name = served_model_name
        self.executor = executor  # tokenisation and chat templates run here, off the event loop

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.served_model_name:
            raise ApiError(
                404, f"The model `{model}` does not exist; this server serves `{self.served_model_name}`.",
                param="model", code="model_not_found",
            )  # fmt: skip

    async def run_blocking(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn)

    def check_token_ids(self, token_ids: list[int], param: str = "prompt") -> None:
        vocab_size = self.info.vocab_size
        bad = [t for t in token_ids if not 0 <= t < vocab_size]
        if bad:
            raise bad_request(f"token ids must be in [0, {vocab_size}), got {bad[:5]}", param)

    def build_request(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, max_tokens_param: str
    ) -> Request:
        """Resolve max_tokens against max_model_len; reject what can never fit, as vLLM does."""
        max_model_len, num_prompt = self.info.max_model_len, len(prompt_token_ids)
        if num_prompt == 0:
            raise bad_request("the prompt is empty after tokenisation", "prompt")
        if params.max_tokens is not None and num_prompt + params.max_tokens > max_model_len:
            raise bad_request(
                f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                f"{num_prompt + params.max_tokens} tokens ({num_prompt} in the prompt, {params.max_tokens} in the "
                f"completion). Please reduce the length of the prompt or the {max_tokens_param}.",
                max_tokens_param,
            )
        if num_prompt >= max_model_len:
            raise bad_request(
                f"This model's maximum context length is {max_model_len} tokens. However, your prompt has "
                f"{num_prompt} tokens, which leaves no room for output. Please reduce the length of the prompt.",
                "prompt",
            )
        max_tokens = params.max_tokens if params.max_tokens is not None else max_model_len - num_prompt
        eos = self.info.eos_token_ids[0] if self.info.eos_token_ids else None
        return Request(
            request_id=request_id,
            prompt_token_ids=prompt_token_ids,
            sampling_params=params,
            eos_token_id=eos,
            max_tokens=max_tokens,
        )

    async def generate(self, request: Request, api_arrival: float) -> AsyncIterator[tuple[Delta, RequestStream]]:
        """Yield one Delta per engine output until the request finishes; abort it in the engine on any early
        exit (stop string, client disconnect, cancellation). Use inside `contextlib.aclosing`."""
        params = request.sampling_params
        detokenizer = IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids, params)
        stream = self.engine.add_request(request, api_arrival)
        try:
            while True:
                output = await stream.next_output()
                token_ids: list[int] = []
                stop_string = None
                for token_id in output.new_token_ids:
                    token_ids.append(token_id)
                    stop_string = detokenizer.update([token_id])
                    if stop_string is not None:
                        break
                logprobs = output.new_logprobs[: len(token_ids)] if output.new_logprobs is not None else None
                finish_reason, stop_reason = output.finish_reason, output.stop_reason
                if stop_string is not None:
                    finish_reason, stop_reason = "stop", stop_string
                    self.engine.finish_early(stream)
                elif finish_reason == "abort":
                    raise ApiError(500, "the engine aborted the request", type="server_error")
                finished = finish_reason is not None
                text = detokenizer.get_next_output_text(finished, delta=True)
                yield Delta(text, token_ids, logprobs, finish_reason, stop_reason), stream
                if finished:
                    return
        finally:
            self.engine.release(stream)

    # ------------------------------------------------------------------------------------------- formatting

    def usage(self, num_prompt: int, num_completion: int, stream: RequestStream | None) -> dict[str, Any]:
        usage: dict[str, Any] = {
            "prompt_tokens": num_prompt,
            "completion_tokens": num_completion,
            "total_tokens": num_prompt + num_completion,
        }
        timing = stream.timing if stream is not None else None
        if timing is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": timing.num_cached_tokens}
        return usage

    def servelab_timing(self, stream: RequestStream) -> dict[str, Any] | None:
        """The `servelab` extension field (docs/SERVER.md)."""
        timing = stream.final_timing()
        if timing is None:
            return None

        def between(start: float | None, end: float | None) -> float | None:
            return None if start is None or end is None else end - start

        return {
            "arrival_time": timing.arrival_time,
            "first_scheduled_time": timing.first_scheduled_time,
            "first_token_time": timing.first_token_time,
            "finished_time": timing.finished_time,
            "num_preemptions": timing.num_preemptions,
            "num_cached_tokens": timing.num_cached_tokens,
            "epoch_offset": self.info.epoch_offset,
            "received_time": stream.received_epoch,
            "queue_time": between(timing.arrival_time, timing.first_scheduled_time),
            "prefill_time": between(timing.first_scheduled_time, timing.first_token_time),
            "decode_time": between(timing.first_token_time, timing.finished_time),
            "engine_time": between(timing.arrival_time, timing.finished_time),
        }

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def completion_logprobs(self, deltas: list[Delta], text_offset: int) -> dict[str, Any]:
        tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
        for delta in deltas:
            for entry in delta.logprobs or []:
                token = self.token_text(entry[0].token_id)
                tokens.append(token)
                token_logprobs.append(entry[0].logprob)
                top_logprobs.append({self.token_text(lp.token_id): lp.logprob for lp in entry})
                offsets.append(text_offset)
                text_offset += len(token)
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
                "text_offset": offsets}  # fmt: skip

    def chat_logprobs(self, deltas: list[Delta], top_n: int) -> dict[str, Any]:
        def item(lp: Logprob) -> dict[str, Any]:
            token = self.token_text(lp.token_id)
            return {"token": token, "logprob": lp.logprob, "bytes": list(token.encode())}

        content = []
        for delta in deltas:
            for entry in delta.logprobs or []:
                content.append({**item(entry[0]), "top_logprobs": [item(lp) for lp in entry[1 : 1 + top_n]]})
        return {"content": content}


Generation = AsyncGenerator[tuple[Delta, RequestStream], None]


async def start_generation(generation: Generation) -> tuple[Delta, RequestStream]:
    """Wait for the first output before any byte is sent, so engine-side rejections still get a status code."""
    try:
        return await generation.__anext__()
    except BaseException:
        await generation.aclose()
        raise


def now_epoch() -> int:
    return int(time.time())
