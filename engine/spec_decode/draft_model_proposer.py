"""Drafts from a smaller model that shares the target's vocabulary, run on its own paged KV cache.

The draft model has its own ModelRunner, KV cache and KVCacheManager (its own block tables, no prefix caching);
its KV cache has the target's kv_cache_dtype.
Its weights load before EngineCore sizes the target's KV cache, and its cache gets as many blocks as the target's,
each block's bytes paid from the target's memory budget (engine/model_runner.py, `determine_num_blocks`).
Per request it remembers how many positions of its KV are valid: after a step the target accepted some drafts,
so the draft KV stays valid up to the first position whose token changed and the rest is recomputed (overwritten)
by the next proposal. A request's draft blocks are freed when it finishes, is aborted or is preempted.

One proposal = k forward passes over the batch: the first runs every token the draft has not seen yet (a whole
prompt after admission or preemption, usually 1-2 tokens in steady state), the next k - 1 one draft token each.
Greedy requests draft the argmax (a point mass); sampled requests draw from q = softmax(draft logits /
temperature), and q is kept for the rejection sampler. A seeded request's drafts draw two uniforms each from its
own generator, before the target's rows do, so its output stays reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from engine.config import CacheConfig, EngineConfig, ModelConfig
from engine.kv_cache_manager import KVCacheManager
from engine.model_runner import ModelRunner
from engine.request import Request
from engine.sampler import sample_categorical
from engine.scheduler_output import ScheduledRequest, SchedulerOutput
from engine.spec_decode.config import SpeculativeConfig


@dataclass
class _DraftState:
    shadow: Request  # the draft's view of the request: its tokens, and num_computed_tokens = valid KV positions
    base: int  # the request's length when the drafts were proposed
    tail: list[int]  # the drafts whose KV the draft model wrote (all but the last)


class DraftModelProposer:
    def __init__(self, config: EngineConfig, spec: SpeculativeConfig) -> None:
        assert spec.model is not None
        mc, cc = config.model_config, config.cache_config
        assert mc.max_model_len is not None
        self.k = spec.num_speculative_tokens
        draft_config = EngineConfig(
            ModelConfig(model=spec.model, dtype=mc.dtype, device=mc.device, seed=mc.seed,
                        max_model_len=mc.max_model_len + self.k, enforce_eager=mc.enforce_eager),
            CacheConfig(block_size=cc.block_size, enable_prefix_caching=False, kv_cache_dtype=cc.kv_cache_dtype),
            replace(config.scheduler_config, speculative_config=None),
        )  # fmt: skip
        self.runner = ModelRunner(draft_config)
        self.kv_cache_manager: KVCacheManager  # set by initialize_kv_cache, once EngineCore has sized the KV cache
        self.generator = torch.Generator(device=self.runner.device).manual_seed(mc.seed + 1)
        self._states: dict[str, _DraftState] = {}

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """The draft's paged KV: `num_blocks` blocks, as many as the target's (EngineCore sizes both together)."""
        self.runner.initialize_kv_cache(num_blocks)
        self.kv_cache_manager = KVCacheManager(num_blocks, self.runner.block_size, enable_caching=False)

    def propose(
        self, requests: list[Request], generators: dict[str, torch.Generator]
    ) -> tuple[list[list[int]], list[torch.Tensor | None]]:
        """Per request: up to k drafts, and for a sampled request the [num_drafts, vocab] q rows that drew them
        (None for greedy requests). A request whose draft KV does not fit gets no drafts this step."""
        drafts: list[list[int]] = [[] for _ in requests]
        probs: list[torch.Tensor | None] = [None] * len(requests)
        batch: list[tuple[int, Request]] = []  # (index into requests, shadow)
        for index, request in enumerate(requests):
            shadow = self._catch_up(request)
            num_new = shadow.num_tokens - shadow.num_computed_tokens
            if self.kv_cache_manager.allocate_slots(shadow, num_new, num_lookahead_tokens=self.k - 1) is not None:
                batch.append((index, shadow))
        if not batch:
            return drafts, probs
        q_rows: list[list[torch.Tensor]] = [[] for _ in requests]
        num_new = [s.num_tokens - s.num_computed_tokens for _, s in batch]
        for _ in range(self.k):
            scheduled = [
                ScheduledRequest(s, n, self.kv_cache_manager.get_block_ids(s.request_id), sample=True)
                for (_, s), n in zip(batch, num_new, strict=True)
            ]
            output = SchedulerOutput(scheduled=scheduled, total_num_scheduled_tokens=sum(num_new))
            logits = self.runner.execute_model(output)
            tokens, q = self._sample(logits, [s for _, s in batch], generators)
            for row, ((index, shadow), n) in enumerate(zip(batch, num_new, strict=True)):
                shadow.num_computed_tokens += n
                shadow.output_token_ids.append(tokens[row])
                drafts[index].append(tokens[row])
                if q is not None and not shadow.sampling_params.is_greedy:
                    q_rows[index].append(q[row])
            num_new = [1] * len(batch)
        for index, shadow in batch:
            # num_computed_tokens = base + k - 1: the last draft was sampled but never fed back.
            state = self._states[shadow.request_id]
            state.base, state.tail = requests[index].num_tokens, drafts[index][:-1]
            if q_rows[index]:
                probs[index] = torch.stack(q_rows[index])
        return drafts, probs

    def _catch_up(self, request: Request) -> Request:
        """The request's shadow, holding its current tokens, with num_computed_tokens cut to the draft KV that is
        still valid (the positions whose tokens the target kept)."""
        tokens = request.all_token_ids
        state = self._states.get(request.request_id)
        if state is None:
            shadow = Request(request.request_id, tokens, request.sampling_params, max_tokens=request.max_tokens)
            self._states[request.request_id] = _DraftState(shadow, len(tokens), [])
            return shadow
        kept = 0
        for draft, token in zip(state.tail, tokens[state.base :], strict=False):
            if draft != token:
                break
            kept += 1
        shadow = state.shadow
        shadow.num_computed_tokens = min(shadow.num_computed_tokens, state.base + kept)
        shadow.prompt_token_ids, shadow.output_token_ids = tokens, []
        return shadow

    def _sample(
        self, logits: torch.Tensor, shadows: list[Request], generators: dict[str, torch.Generator]
    ) -> tuple[list[int], torch.Tensor | None]:
        """Argmax for greedy requests; a draw from softmax(logits / temperature) otherwise (with those q rows)."""
        greedy = torch.tensor([s.sampling_params.is_greedy for s in shadows], device=logits.device)
        argmax = logits.argmax(dim=-1)
        if bool(greedy.all()):
            return argmax.tolist(), None
        temperature = torch.tensor(
            [1.0 if s.sampling_params.is_greedy else s.sampling_params.temperature for s in shadows],
            device=logits.device,
        )
        scaled = logits / temperature.unsqueeze(1)
        uniforms = torch.rand(len(shadows), 2, generator=self.generator, device=logits.device)
        for row, shadow in enumerate(shadows):
            seed = shadow.sampling_params.seed
            if seed is None or shadow.sampling_params.is_greedy:
                continue
            if shadow.request_id not in generators:
                generators[shadow.request_id] = torch.Generator(device=logits.device).manual_seed(seed)
            uniforms[row] = torch.rand(2, generator=generators[shadow.request_id], device=logits.device)
        sampled = sample_categorical(scaled, uniforms)
        return torch.where(greedy, argmax, sampled).tolist(), scaled.softmax(dim=-1)

    def free(self, request_ids: list[str]) -> None:
        """Drop the draft KV of requests that finished or were preempted (unknown ids are ignored)."""
        for request_id in request_ids:
            state = self._states.pop(request_id, None)
            if state is not None:
                self.kv_cache_manager.free(state.shadow)

    @property
    def num_free_blocks(self) -> int:
        return self.kv_cache_manager.num_free_blocks()
