"""What both OpenAI endpoints share: model checks, request building (engine/processor.py), a request's n
completions generated in the API process (detokenisation and stop strings here, token ids in the engine), the
response and stream skeletons, usage, logprob and timing formatting, SSE framing."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from typing import Any, TypeVar

from engine.entrypoints.engine_client import EngineClient, OutputQueue, RequestStream, next_output
from engine.entrypoints.protocol import ApiError, GenerationRequest, bad_request
from engine.outputs import Logprob
from engine.processor import CompletionDelta, ParentRequest, Processor, RequestError, merge_timings
from engine.request import Request, RequestTiming

T = TypeVar("T")

SSE_DONE = b"data: [DONE]\n\n"


def sse_event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now_epoch() -> int:
    return int(time.time())


def grammar_timing(timing: RequestTiming) -> dict[str, Any]:
    """Structured outputs' share of the `servelab` field (None for an unconstrained request): the wait for the
    compiled grammar, and the time spent filling its bitmask rows, in total and per step."""
    steps = timing.num_grammar_bitmask_steps
    return {
        "grammar_compile_time": timing.grammar_compile_time,
        "grammar_bitmask_time": timing.grammar_bitmask_time if timing.grammar_compile_time is not None else None,
        "grammar_bitmask_time_per_step": timing.grammar_bitmask_time / steps if steps else None,
    }


class Generation:
    """One API request in the engine: its n engine requests (one per completion) and their deltas, in the order
    the engine produces them. Iterate `deltas` inside `contextlib.aclosing`: any early exit (client disconnect,
    cancellation, an error) aborts every unfinished engine request."""

    def __init__(self, engine: EngineClient, request: Request, tokenizer: Any, api_arrival: float) -> None:
        self.request_id = request.request_id
        self.num_prompt_tokens = request.num_prompt_tokens
        self.parent = ParentRequest(request, tokenizer)
        self.n = len(self.parent.children)
        self.streams: list[RequestStream] = []
        self.deltas = self._generate(engine, api_arrival)

    async def _generate(self, engine: EngineClient, api_arrival: float) -> AsyncGenerator[CompletionDelta, None]:
        outputs: OutputQueue = asyncio.Queue()
        by_id: dict[str, RequestStream] = {}
        try:
            for child in self.parent.children:
                stream = engine.add_request(child, api_arrival, outputs)
                self.streams.append(stream)
                by_id[child.request_id] = stream
            while not self.parent.finished:
                output = await next_output(outputs, by_id)
                delta = self.parent.update(output)
                if delta.stopped_by_string:
                    engine.finish_early(by_id[output.request_id])
                elif delta.finish_reason == "abort":
                    raise ApiError(500, "the engine aborted the request", type="server_error")
                yield delta
        finally:
            for stream in self.streams:
                engine.release(stream)

    def timing(self) -> RequestTiming | None:
        """Engine-side timing as of the outputs consumed so far (the children's, merged)."""
        timings = [stream.timing for stream in self.streams if stream.timing is not None]
        return merge_timings(timings) if timings else None

    def final_timing(self) -> RequestTiming | None:
        timings = [t for stream in self.streams if (t := stream.final_timing()) is not None]
        return merge_timings(timings) if timings else None


class OpenAIServing(ABC):
    """The flow both endpoints share; a subclass builds its choices (`full_choice`, `chunk_choice`)."""

    object_name: str  # "text_completion" | "chat.completion"
    chunk_object_name: str

    def __init__(
        self, engine: EngineClient, tokenizer: Any, served_model_name: str, executor: ThreadPoolExecutor
    ) -> None:
        assert engine.info is not None, "start the engine before serving"
        self.engine = engine
        self.info = engine.info
        self.tokenizer = tokenizer
        self.processor = Processor(tokenizer, self.info.max_model_len, self.info.vocab_size, self.info.eos_token_ids)
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

    def check_token_ids(self, token_ids: list[int], param: str) -> None:
        try:
            self.processor.check_token_ids(token_ids, param)
        except RequestError as error:
            raise bad_request(str(error), error.param) from error

    def build_request(self, id_prefix: str, prompt: str | list[int], req: GenerationRequest) -> Request:
        """Tokenize (a text prompt) and validate, with vLLM's server errors (see Processor.build_request)."""
        try:
            return self.processor.build_request(
                random_id(id_prefix), prompt, req.sampling_params, max_tokens_param=req.max_tokens_param
            )
        except RequestError as error:
            param = req.structured_outputs_param if error.param == "structured_outputs" else error.param
            raise bad_request(str(error), param) from error

    # ------------------------------------------------------------------------------------------- responses

    @abstractmethod
    def full_choice(self, req: Any, index: int, deltas: list[CompletionDelta]) -> dict[str, Any]:
        """Choice `index` of a whole response, from all its deltas."""

    @abstractmethod
    def chunk_choice(self, req: Any, delta: CompletionDelta, text_offset: int) -> dict[str, Any]:
        """One streamed choice; `text_offset` is how much text of this choice went out before."""

    def opening_chunk_choices(self, n: int) -> list[dict[str, Any]]:
        """Choices sent, one chunk each, with the first engine output (before its text)."""
        return []

    async def respond(
        self, req: GenerationRequest, request: Request, api_arrival: float
    ) -> dict[str, Any] | AsyncIterator[bytes]:
        """Run `request` in the engine; the whole response, or its SSE stream. Waits for the first engine output
        before any byte is sent, so engine-side rejections still get a status code."""
        generation = Generation(self.engine, request, self.tokenizer, api_arrival)
        try:
            first = await generation.deltas.__anext__()
        except BaseException:
            await generation.deltas.aclose()
            raise
        if req.stream:
            return self._stream(req, generation, first)
        return await self._full(req, generation, first)

    async def _full(self, req: GenerationRequest, generation: Generation, first: CompletionDelta) -> dict[str, Any]:
        by_index: list[list[CompletionDelta]] = [[] for _ in range(generation.n)]
        by_index[first.index].append(first)
        async with aclosing(generation.deltas):
            async for delta in generation.deltas:
                by_index[delta.index].append(delta)
        num_completion = sum(len(d.token_ids) for deltas in by_index for d in deltas)
        return {
            "id": generation.request_id,
            "object": self.object_name,
            "created": now_epoch(),
            "model": self.served_model_name,
            "choices": [self.full_choice(req, index, deltas) for index, deltas in enumerate(by_index)],
            "usage": self.usage(generation.num_prompt_tokens, num_completion, generation),
            "servelab": self.servelab_timing(generation),
        }

    async def _stream(
        self, req: GenerationRequest, generation: Generation, first: CompletionDelta
    ) -> AsyncIterator[bytes]:
        base = {"id": generation.request_id, "object": self.chunk_object_name, "created": now_epoch(),
                "model": self.served_model_name}  # fmt: skip
        options = req.stream_options
        num_prompt, num_completion, num_finished = generation.num_prompt_tokens, 0, 0
        text_offsets = [0] * generation.n

        def chunk(choice: dict[str, Any]) -> dict[str, Any]:
            body: dict[str, Any] = {**base, "choices": [choice]}
            if options.include_usage:
                continuous = options.continuous_usage_stats
                body["usage"] = self.usage(num_prompt, num_completion, None) if continuous else None
            return body

        async def deltas() -> AsyncIterator[CompletionDelta]:
            yield first
            async for delta in generation.deltas:
                yield delta

        # Opening chunks go out with the first engine output (after prefill), as vLLM does, so a client's
        # first-chunk TTFT still measures the first token.
        for choice in self.opening_chunk_choices(generation.n):
            yield sse_event(chunk(choice))
        async with aclosing(generation.deltas):
            async for delta in deltas():
                num_completion += len(delta.token_ids)
                body = chunk(self.chunk_choice(req, delta, text_offsets[delta.index]))
                text_offsets[delta.index] += len(delta.text)
                num_finished += delta.finished
                if num_finished == generation.n and not options.include_usage:
                    body["servelab"] = self.servelab_timing(generation)
                yield sse_event(body)
        if options.include_usage:
            yield sse_event(
                {**base, "choices": [], "usage": self.usage(num_prompt, num_completion, generation),
                 "servelab": self.servelab_timing(generation)}
            )  # fmt: skip
        yield SSE_DONE

    # ------------------------------------------------------------------------------------------- formatting

    def usage(self, num_prompt: int, num_completion: int, generation: Generation | None) -> dict[str, Any]:
        """OpenAI's usage; completion tokens count every choice's."""
        usage: dict[str, Any] = {
            "prompt_tokens": num_prompt,
            "completion_tokens": num_completion,
            "total_tokens": num_prompt + num_completion,
        }
        timing = generation.timing() if generation is not None else None
        if timing is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": timing.num_cached_tokens}
        return usage

    def servelab_timing(self, generation: Generation) -> dict[str, Any] | None:
        """The `servelab` extension field (docs/SERVER.md); with n > 1, the span of all completions."""
        timing = generation.final_timing()
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
            "received_time": generation.streams[0].received_epoch,
            "api_arrival_time": generation.streams[0].api_arrival,  # API-process monotonic: the handler's start
            "queue_time": between(timing.arrival_time, timing.first_scheduled_time),
            "prefill_time": between(timing.first_scheduled_time, timing.first_token_time),
            "decode_time": between(timing.first_token_time, timing.finished_time),
            "engine_time": between(timing.arrival_time, timing.finished_time),
            **grammar_timing(timing),
        }

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def completion_logprobs(self, deltas: list[CompletionDelta], text_offset: int) -> dict[str, Any]:
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

    def chat_logprobs(self, deltas: list[CompletionDelta], top_n: int) -> dict[str, Any]:
        def item(lp: Logprob) -> dict[str, Any]:
            token = self.token_text(lp.token_id)
            return {"token": token, "logprob": lp.logprob, "bytes": list(token.encode())}

        content = []
        for delta in deltas:
            for entry in delta.logprobs or []:
                content.append({**item(entry[0]), "top_logprobs": [item(lp) for lp in entry[1 : 1 + top_n]]})
        return {"content": content}
