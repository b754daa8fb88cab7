"""EngineCore: the token-ids-only loop. step() = schedule → one forward pass → sample → update."""

from __future__ import annotations

import dataclasses
import logging

import torch

from engine.config import EngineConfig
from engine.model_runner import ModelRunner
from engine.outputs import EngineCoreOutput, Logprob, SchedulerStats
from engine.request import Request
from engine.sampler import Sampler, SamplingMetadata
from engine.scheduler import Scheduler

logger = logging.getLogger(__name__)


class EngineCore:
    def __init__(self, config: EngineConfig) -> None:
        self.model_runner = ModelRunner(config)  # finalizes config (max_model_len)
        self.config = config
        runner = self.model_runner
        self.max_model_len: int = runner.max_model_len
        self.eos_token_ids: list[int] = list(runner.eos_token_ids)
        self.vocab_size: int = runner.vocab_size
        self.num_gpu_blocks = runner.determine_num_blocks()
        runner.initialize_kv_cache(self.num_gpu_blocks)
        self.scheduler = Scheduler(
            config.scheduler_config, config.cache_config, self.max_model_len, self.num_gpu_blocks
        )
        self.sampler = Sampler(runner.device, config.model_config.seed)
        self._generators: dict[str, torch.Generator] = {}  # per seeded request, dropped when it finishes

    def add_request(self, request: Request) -> None:
        """Queue a request; raises ValueError (and keeps nothing) if it can never run."""
        bad = [t for t in request.prompt_token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(
                f"request {request.request_id!r}: token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})"
            )
        params = request.sampling_params
        if params.seed is not None and not -(2**63) <= params.seed < 2**64:
            raise ValueError(f"request {request.request_id!r}: seed must fit in 64 bits, got {params.seed}")
        extra_eos = [t for t in self.eos_token_ids if t != request.eos_token_id and t not in params.stop_token_ids]
        if extra_eos and request.eos_token_id in self.eos_token_ids and not params.ignore_eos:
            # As vLLM: the model's other EOS ids (generation_config) act as stop token ids.
            request.sampling_params = dataclasses.replace(params, stop_token_ids=[*params.stop_token_ids, *extra_eos])
        self.scheduler.add_request(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        """Finish the requests now (status FINISHED_ABORTED) and free their KV blocks."""
        for request in self.scheduler.finish_requests(request_ids):
            self._generators.pop(request.request_id, None)

    def step(self) -> list[EngineCoreOutput]:
        if not self.scheduler.has_unfinished_requests():
            return []
        scheduler_output = self.scheduler.schedule()
        for request_id in scheduler_output.finished_request_ids:
            self._generators.pop(request_id, None)
        if scheduler_output.is_empty:
            if not self.scheduler.running:
                raise RuntimeError("the scheduler can admit no waiting request into an idle engine (a bug)")
            return []
        sampling = [s.request for s in scheduler_output.sampling_requests()]
        logits = self.model_runner.execute_model(scheduler_output)
        sampled_token_ids: list[list[int]] = []
        logprobs: list[list[list[Logprob]] | None] | None = None
        if sampling:
            metadata = SamplingMetadata.build(sampling, self.vocab_size, logits.device, self._generators)
            sampler_output = self.sampler(logits, metadata)
            sampled_token_ids = [[token_id] for token_id in sampler_output.sampled_token_ids]
            logprobs = [None if lp is None else [lp] for lp in sampler_output.logprobs]
        return self.scheduler.update_from_output(scheduler_output, sampled_token_ids, logprobs)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def get_stats(self) -> SchedulerStats:
        return self.scheduler.get_stats()

    def reset_prefix_cache(self) -> bool:
        return self.scheduler.reset_prefix_cache()
