"""The engine's speculative decoding around one step: propose drafts, verify them, count the acceptances."""

from __future__ import annotations

import torch

from engine.config import EngineConfig
from engine.outputs import SpecDecodingStats
from engine.request import Request
from engine.sampler import Sampler, SamplerOutput, SamplingMetadata
from engine.scheduler_output import ScheduledRequest, SchedulerOutput
from engine.spec_decode.config import SpeculativeConfig
from engine.spec_decode.ngram_proposer import NgramProposer
from engine.spec_decode.rejection_sampler import rejection_sample


class SpeculativeDecoder:
    def __init__(self, config: EngineConfig, spec: SpeculativeConfig) -> None:
        self.spec = spec
        self.ngram: NgramProposer | None = None
        self.draft_model = None
        if spec.method == "ngram":
            assert spec.prompt_lookup_min is not None and spec.prompt_lookup_max is not None
            self.ngram = NgramProposer(spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max)
        else:
            from engine.spec_decode.draft_model_proposer import DraftModelProposer

            self.draft_model = DraftModelProposer(config, spec)
        self.stats = SpecDecodingStats(spec.num_speculative_tokens)
        self._draft_probs: dict[str, torch.Tensor] = {}  # q rows of the drafts proposed for the coming step

    @classmethod
    def from_config(cls, config: EngineConfig) -> SpeculativeDecoder | NoSpeculation:
        """NoSpeculation when the config has no speculative_config. A draft model is loaded; its KV cache waits
        for `initialize_kv_cache`."""
        spec = config.speculative_config
        return NoSpeculation() if spec is None else cls(config, spec)

    @property
    def draft_block_bytes(self) -> int:
        """Bytes of one draft KV block (0 without a draft model): the target's budget pays them per block."""
        return self.draft_model.runner.block_bytes if self.draft_model is not None else 0

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """Give the draft model (if any) as many KV blocks as the target's cache holds."""
        if self.draft_model is not None:
            self.draft_model.initialize_kv_cache(num_blocks)

    def propose(self, running: list[Request], generators: dict[str, torch.Generator]) -> None:
        """Set the drafts of every running request whose next step is a decode; clear everyone else's."""
        self._draft_probs.clear()
        decoding = [r for r in running if r.num_tokens - r.num_computed_tokens == 1]
        for request in running:
            request.spec_token_ids = []
        if not decoding:
            return
        if self.ngram is not None:
            drafts = self.ngram.propose([r.all_token_ids for r in decoding])
        else:
            assert self.draft_model is not None
            drafts, probs = self.draft_model.propose(decoding, generators)
            for request, q in zip(decoding, probs, strict=True):
                if q is not None:
                    self._draft_probs[request.request_id] = q
        for request, request_drafts in zip(decoding, drafts, strict=True):
            request.spec_token_ids = request_drafts

    def after_schedule(self, scheduler_output: SchedulerOutput, requests: dict[str, Request]) -> None:
        """Preempted requests lose their drafts and their draft KV; finished ones their draft KV."""
        for request_id in scheduler_output.preempted_request_ids:
            if request_id in requests:
                requests[request_id].spec_token_ids = []
        self.free(scheduler_output.preempted_request_ids + scheduler_output.finished_request_ids)

    def sample(
        self, sampler: Sampler, logits: torch.Tensor, metadata: SamplingMetadata, sampling: list[ScheduledRequest]
    ) -> SamplerOutput:
        """The sampler's output for the step's rows; drafts that came with q rows are rejection-sampled."""
        if not self._draft_probs:
            return sampler(logits, metadata)
        draft_tokens: list[int | None] = []
        draft_probs: list[torch.Tensor | None] = []
        for scheduled in sampling:
            drafts = scheduled.spec_token_ids
            q = self._draft_probs.get(scheduled.request.request_id)
            draft_tokens += [*drafts, None]
            draft_probs += [None] * (len(drafts) + 1) if q is None else [*q[: len(drafts)], None]
        return rejection_sample(sampler, logits, metadata, draft_tokens, draft_probs)

    def observe(self, scheduled: ScheduledRequest, accepted: list[int]) -> None:
        self.stats.observe(len(scheduled.spec_token_ids), len(accepted) - 1)

    def free(self, request_ids: list[str]) -> None:
        if self.draft_model is not None:
            self.draft_model.free(request_ids)


class NoSpeculation:
    """The decoder when speculation is off: no drafts, plain sampling, no draft KV, no stats. EngineCore calls it
    exactly as it calls SpeculativeDecoder, so its step has no speculation branches."""

    draft_model = None
    stats: SpecDecodingStats | None = None
    draft_block_bytes = 0

    def initialize_kv_cache(self, num_blocks: int) -> None:
        pass

    def propose(self, running: list[Request], generators: dict[str, torch.Generator]) -> None:
        pass

    def after_schedule(self, scheduler_output: SchedulerOutput, requests: dict[str, Request]) -> None:
        pass

    def sample(
        self, sampler: Sampler, logits: torch.Tensor, metadata: SamplingMetadata, sampling: list[ScheduledRequest]
    ) -> SamplerOutput:
        return sampler(logits, metadata)

    def observe(self, scheduled: ScheduledRequest, accepted: list[int]) -> None:
        pass

    def free(self, request_ids: list[str]) -> None:
        pass
