"""LLMEngine: text in, text out around EngineCore — tokenization, incremental detokenization, stop strings."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from engine.config import EngineConfig
from engine.detokenizer import IncrementalDetokenizer
from engine.engine_core import EngineCore
from engine.outputs import CompletionOutput, EngineCoreOutput, Logprob, RequestOutput, SchedulerStats
from engine.request import Request, RequestTiming
from engine.sampling_params import SamplingParams
from engine.tokenizer import get_tokenizer


@dataclass
class _RequestState:
    request: Request
    prompt: str | None
    detokenizer: IncrementalDetokenizer
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[list[Logprob]] | None = None


class LLMEngine:
    def __init__(self, engine_core: EngineCore, tokenizer: Any) -> None:
        self.engine_core = engine_core
        self.config = engine_core.config
        self.tokenizer = tokenizer
        self._states: dict[str, _RequestState] = {}

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLMEngine:
        mc = config.model_config
        tokenizer = get_tokenizer(mc.tokenizer or mc.model)
        return cls(EngineCore(config), tokenizer)

    @property
    def max_model_len(self) -> int:
        return self.engine_core.max_model_len

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> None:
        """Tokenize and queue; a ValueError (bad prompt, too long for the model or the KV cache) keeps nothing."""
        if request_id in self._states:
            raise ValueError(f"request id {request_id!r} is already in the engine")
        if isinstance(prompt, str):
            prompt_text, prompt_token_ids = prompt, list(self.tokenizer.encode(prompt))
        else:
            prompt_text, prompt_token_ids = None, [int(t) for t in prompt]
        max_tokens = params.max_tokens if params.max_tokens is not None else self.max_model_len - len(prompt_token_ids)
        eos_ids = self.engine_core.eos_token_ids
        request = Request(
            request_id=request_id,
            prompt_token_ids=prompt_token_ids,
            sampling_params=params,
            eos_token_id=eos_ids[0] if eos_ids else None,
            max_tokens=max_tokens,
            timing=RequestTiming(arrival_time if arrival_time is not None else time.monotonic()),
        )
        self.engine_core.add_request(request)
        detokenizer = IncrementalDetokenizer(self.tokenizer, prompt_token_ids, params)
        self._states[request_id] = _RequestState(
            request, prompt_text, detokenizer, logprobs=[] if params.logprobs is not None else None
        )

    def step(self) -> list[RequestOutput]:
        """One engine step; a cumulative RequestOutput for every request that progressed or finished."""
        return [out for core_output in self.engine_core.step() if (out := self._process(core_output)) is not None]

    def _process(self, core_output: EngineCoreOutput) -> RequestOutput | None:
        state = self._states.get(core_output.request_id)
        if state is None:
            return None
        finish_reason, stop_reason = core_output.finish_reason, core_output.stop_reason
        for index, token_id in enumerate(core_output.new_token_ids):
            state.token_ids.append(token_id)
            if state.logprobs is not None and core_output.new_logprobs is not None:
                state.logprobs.append(core_output.new_logprobs[index])
            stop_string = state.detokenizer.update([token_id])
            if stop_string is not None:
                if finish_reason is None:
                    self.engine_core.abort_requests([core_output.request_id])
                finish_reason, stop_reason = "stop", stop_string
                break
        finished = finish_reason is not None
        completion = CompletionOutput(
            index=0,
            text=state.detokenizer.get_next_output_text(finished, delta=False),
            token_ids=list(state.token_ids),
            finish_reason=finish_reason,
            stop_reason=stop_reason,
            logprobs=list(state.logprobs) if state.logprobs is not None else None,
        )
        if finished:
            del self._states[core_output.request_id]
        return RequestOutput(
            request_id=core_output.request_id,
            prompt=state.prompt,
            prompt_token_ids=state.request.prompt_token_ids,
            outputs=[completion],
            finished=finished,
            timing=state.request.timing if finished else None,
        )

    def abort_request(self, request_ids: list[str]) -> None:
        self.engine_core.abort_requests(request_ids)
        for request_id in request_ids:
            self._states.pop(request_id, None)

    def has_unfinished_requests(self) -> bool:
        return self.engine_core.has_unfinished_requests()

    def get_stats(self) -> SchedulerStats:
        return self.engine_core.get_stats()

    def reset_prefix_cache(self) -> bool:
        return self.engine_core.reset_prefix_cache()

    def get_tokenizer(self) -> Any:
        return self.tokenizer
