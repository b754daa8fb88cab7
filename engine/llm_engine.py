"""LLMEngine: text in, text out around EngineCore, in one process. Request building, parallel sampling and
detokenisation are engine/processor.py's, shared with the OpenAI server."""

from __future__ import annotations

from typing import Any

from engine.config import EngineConfig
from engine.engine_core import EngineCore
from engine.outputs import RequestOutput, SchedulerStats
from engine.processor import ParentRequest, Processor
from engine.sampling_params import SamplingParams
from engine.tokenizer import get_tokenizer


class LLMEngine:
    def __init__(self, engine_core: EngineCore, tokenizer: Any) -> None:
        self.engine_core = engine_core
        self.config = engine_core.config
        self.tokenizer = tokenizer
        self.processor = Processor(
            tokenizer, engine_core.max_model_len, engine_core.vocab_size, engine_core.eos_token_ids
        )
        self._parents: dict[str, ParentRequest] = {}  # by request id
        self._parent_of: dict[str, ParentRequest] = {}  # by the id of each unfinished engine request

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
        """Tokenize and queue (n engine requests when params.n > 1); a ValueError (bad prompt, too long for the
        model or the KV cache) keeps nothing."""
        if request_id in self._parents:
            raise ValueError(f"request id {request_id!r} is already in the engine")
        request = self.processor.build_request(request_id, prompt, params, arrival_time)
        parent = ParentRequest(request, self.tokenizer, prompt if isinstance(prompt, str) else None)
        added: list[str] = []
        try:
            for child in parent.children:
                self.engine_core.add_request(child)
                added.append(child.request_id)
        except ValueError:
            self.engine_core.abort_requests(added)
            raise
        self._parents[request_id] = parent
        self._parent_of.update((child_id, parent) for child_id in added)

    def step(self) -> list[RequestOutput]:
        """One engine step; a cumulative RequestOutput (all n completions) for every request that progressed."""
        progressed: dict[str, ParentRequest] = {}
        for core_output in self.engine_core.step():
            parent = self._parent_of.get(core_output.request_id)
            if parent is None:
                continue
            delta = parent.update(core_output)
            if delta.stopped_by_string:
                self.engine_core.abort_requests([core_output.request_id])
            if delta.finished:
                del self._parent_of[core_output.request_id]
            progressed[parent.request_id] = parent
        outputs = []
        for parent in progressed.values():
            if parent.finished:
                del self._parents[parent.request_id]
            outputs.append(parent.request_output())
        return outputs

    def abort_request(self, request_ids: list[str]) -> None:
        """Abort requests (each with all its engine requests); unknown ids are ignored."""
        engine_ids = []
        for request_id in request_ids:
            parent = self._parents.pop(request_id, None)
            if parent is not None:
                engine_ids += [child.request_id for child in parent.children]
        for engine_id in engine_ids:
            self._parent_of.pop(engine_id, None)
        self.engine_core.abort_requests(engine_ids)

    def has_unfinished_requests(self) -> bool:
        return self.engine_core.has_unfinished_requests()

    def get_stats(self) -> SchedulerStats:
        return self.engine_core.get_stats()

    def reset_prefix_cache(self) -> bool:
        return self.engine_core.reset_prefix_cache()

    def get_tokenizer(self) -> Any:
        return self.tokenizer
