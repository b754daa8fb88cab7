"""vLLM v1 style scheduler: one phase-less step under a token budget.

Each request only knows how many of its tokens have KV in the cache (num_computed_tokens); a step gives
every request the tokens it still lacks, within max_num_batched_tokens and max_num_seqs. Decodes,
continuing prefill chunks and fresh prompts therefore share one batch. Running requests go first, then
waiting ones in arrival order. A running request whose known tokens all fit also gets its draft tokens
(`Request.spec_token_ids`) scheduled behind them, with KV slots reserved for each. When the KV pool runs
dry, the most recently admitted running request is preempted by recompute: its blocks are freed (their
cached prefixes usually make the re-prefill cheap) and it goes back to the front of the queue.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

from engine.block_pool import KVCacheBlock
from engine.config import EngineConfig
from engine.kv_cache_manager import KVCacheManager, cdiv
from engine.outputs import EngineCoreOutput, Logprob, SchedulerStats
from engine.request import FINISHED_STATUSES, Request, RequestStatus
from engine.scheduler_output import ScheduledRequest, SchedulerOutput

if TYPE_CHECKING:
    from engine.structured_output.manager import StructuredOutputManager


class Scheduler:
    def __init__(self, config: EngineConfig, num_gpu_blocks: int) -> None:
        max_model_len = config.model_config.max_model_len
        if max_model_len is None:
            raise ValueError("the scheduler needs a resolved max_model_len (build the config with from_kwargs)")
        self.scheduler_config = config.scheduler_config
        self.max_model_len: int = max_model_len
        self.block_size = config.cache_config.block_size
        self.kv_cache_manager = KVCacheManager(
            num_gpu_blocks, config.cache_config.block_size, config.cache_config.enable_prefix_caching
        )
        self.requests: dict[str, Request] = {}  # every unfinished request
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order: the tail is the preemption victim
        self.finished_req_ids: set[str] = set()  # finished since the last schedule(), for the runner
        self.num_preemptions = 0
        self.num_prompt_tokens = 0
        self.num_generation_tokens = 0
        # Set by EngineCore: says when a WAITING_FOR_FSM request's grammar is compiled (engine/structured_output).
        self.structured_output_manager: StructuredOutputManager | None = None

    # ---------------------------------------------------------------- requests in and out

    def add_request(self, request: Request) -> None:
        """Queue a request; raise ValueError now if it could never run, rather than hang the queue."""
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in the engine")
        num_prompt = request.num_prompt_tokens
        if num_prompt == 0:
            raise ValueError(f"request {request.request_id!r}: the prompt is empty")
        if num_prompt + 1 > self.max_model_len:
            raise ValueError(
                f"request {request.request_id!r}: the prompt has {num_prompt} tokens, but max_model_len="
                f"{self.max_model_len} leaves no room for an output token; shorten the prompt or raise max_model_len"
            )
        if request.max_tokens < 1:
            raise ValueError(f"request {request.request_id!r}: max_tokens must be >= 1, got {request.max_tokens}")
        # The last sampled token's KV is never written, hence the -1.
        max_kv_tokens = min(num_prompt + request.max_tokens, self.max_model_len) - 1
        num_blocks = self.kv_cache_manager.num_blocks
        if cdiv(max_kv_tokens, self.block_size) > num_blocks:
            raise ValueError(
                f"request {request.request_id!r}: {num_prompt} prompt tokens + up to {request.max_tokens} output "
                f"tokens need {cdiv(max_kv_tokens, self.block_size)} KV blocks, but the KV cache holds only "
                f"{num_blocks} blocks of {self.block_size} tokens; lower max_tokens or max_model_len, "
                "or give the KV cache more memory"
            )
        request.status = RequestStatus.WAITING
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def finish_requests(
        self, request_ids: Iterable[str], status: RequestStatus = RequestStatus.FINISHED_ABORTED
    ) -> list[Request]:
        """Finish requests from outside (abort, stop string): free their KV blocks now. Unknown ids are ignored."""
        assert status.is_finished
        finished = []
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is None:
                continue
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove(request)
            request.status = status
            self._release(request)
            finished.append(request)
        return finished

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # ---------------------------------------------------------------- one step

    def schedule(self) -> SchedulerOutput:
        """Plan one step. Per running request this is O(1) unless it needs new blocks: a decode whose slots are
        reserved costs one slot-limit lookup and its ScheduledRequest, which shares the KV manager's block-id list
        (never changed in place) instead of copying it. This is the hot path at hundreds of running sequences, so
        it reads the KV manager's tables directly rather than through several calls."""
        budget = self.scheduler_config.max_num_batched_tokens
        manager = self.kv_cache_manager
        block_ids_of = manager.req_to_block_ids
        slot_limit_of = manager.req_to_slot_limit
        scheduled: list[ScheduledRequest] = []
        preempted: list[Request] = []

        # Running requests first: decodes (1 token, + drafts) and continuing prefill chunks.
        running = self.running
        for request in running:  # a preemption pops the list's tail: the iterator then stops before it
            if budget <= 0:
                break
            num_known = len(request.prompt_token_ids) + len(request.output_token_ids)  # request.num_tokens, inlined
            num_computed = request.num_computed_tokens
            num_new_tokens = num_known - num_computed
            if num_new_tokens > budget:
                num_new_tokens = budget
            assert num_new_tokens > 0, f"running request {request.request_id} has nothing to compute"
            # Without drafts the record shares the request's empty draft list rather than allocating one per step
            # (nothing appends to a draft list: the drafter and the scheduler replace it).
            drafts = request.spec_token_ids
            if drafts:
                drafts = self._drafts_within_limits(request, num_new_tokens, budget)
            if drafts or num_computed + num_new_tokens > slot_limit_of[request.request_id]:
                while not self._allocate(request, num_new_tokens, num_lookahead_tokens=len(drafts)):
                    # Victims come from the tail, past `request`, so none of them was scheduled yet this step.
                    victim = running.pop()
                    self._preempt(victim)
                    preempted.append(victim)
                    if victim is request:
                        break
                if request.status != RequestStatus.RUNNING:
                    break
            num_scheduled = num_new_tokens + len(drafts)
            scheduled.append(
                ScheduledRequest(
                    request,
                    num_scheduled,
                    block_ids_of[request.request_id],
                    num_computed + num_new_tokens >= num_known,  # sample
                    drafts,
                )
            )
            budget -= num_scheduled

        # Then waiting requests, first come first served; none after a preemption (the pool is tight).
        now = time.monotonic()
        skipped_waiting: deque[Request] = deque()  # still compiling their grammar: they keep their place
        while not preempted and self.waiting and budget > 0:
            if len(self.running) >= self.scheduler_config.max_num_seqs:
                break
            request = self.waiting[0]
            if request.status == RequestStatus.WAITING_FOR_FSM and not self._grammar_ready(request):
                skipped_waiting.append(self.waiting.popleft())
                continue
            hit_blocks, num_hit_tokens = manager.get_computed_blocks(request)
            num_new_tokens = request.num_tokens - num_hit_tokens
            if not self.scheduler_config.enable_chunked_prefill and num_new_tokens > budget:
                break
            num_new_tokens = min(num_new_tokens, budget)
            if not self._allocate(request, num_new_tokens, hit_blocks, num_hit_tokens):
                break
            self.waiting.popleft()
            self.running.append(request)
            request.status = RequestStatus.RUNNING
            if request.timing.first_scheduled_time is None:
                request.timing.first_scheduled_time = now
                request.timing.num_cached_tokens = num_hit_tokens
            scheduled.append(
                ScheduledRequest(
                    request,
                    num_new_tokens,
                    manager.get_block_ids(request.request_id),
                    sample=request.num_computed_tokens + num_new_tokens >= request.num_tokens,
                )
            )
            budget -= num_new_tokens
        self.waiting.extendleft(reversed(skipped_waiting))

        output = SchedulerOutput(
            scheduled=scheduled,
            total_num_scheduled_tokens=self.scheduler_config.max_num_batched_tokens - budget,
            preempted_request_ids=[request.request_id for request in preempted],
            finished_request_ids=sorted(self.finished_req_ids),
        )
        self.finished_req_ids = set()
        return output

    def update_from_output(
        self,
        scheduler_output: SchedulerOutput,
        sampled_token_ids: list[list[int]],
        logprobs: list[list[list[Logprob]] | None] | None = None,
    ) -> list[EngineCoreOutput]:
        """Apply one executed step: advance num_computed_tokens, append the accepted tokens, finish requests.

        `sampled_token_ids[i]` (and `logprobs[i]`, one entry per token) belong to
        `scheduler_output.sampling_requests()[i]`: the drafts the target accepted, in order, then the one token
        the target chose after them (1 to 1 + len(spec_token_ids) tokens). num_computed_tokens advances by the
        known tokens plus the accepted drafts only, so a rejected draft's KV slot lies past it, never enters the
        prefix cache and is overwritten by the next step.
        """
        sampling = scheduler_output.sampling_requests()
        if len(sampled_token_ids) != len(sampling):
            raise ValueError(f"{len(sampled_token_ids)} sampled rows for {len(sampling)} sampling requests")
        if sampled_token_ids and set(map(len, sampled_token_ids)) != {1}:  # C-speed scan; the loop only with drafts
            for scheduled, tokens in zip(sampling, sampled_token_ids, strict=True):
                if len(tokens) != 1 and not 1 <= len(tokens) <= 1 + len(scheduled.spec_token_ids):
                    raise ValueError(
                        f"request {scheduled.request.request_id}: {len(tokens)} tokens for a step with "
                        f"{len(scheduled.spec_token_ids)} drafts"
                    )
        now = time.monotonic()
        outputs = []
        num_stopped = row = num_generation_tokens = 0
        check_stop = self._check_stop
        # A scheduled request is RUNNING, or finished (aborted) since schedule(): an identity test tells which.
        running_status = RequestStatus.RUNNING
        for scheduled in scheduler_output.scheduled:  # one pass: each request's update touches only itself
            request = scheduled.request
            finished = request.status is not running_status
            if not finished:  # the known tokens; accepted drafts are counted below
                request.num_computed_tokens += scheduled.num_scheduled_tokens - len(scheduled.spec_token_ids)
            if not scheduled.sample:
                continue
            tokens = sampled_token_ids[row]
            row += 1
            if finished:
                continue
            if len(tokens) == 1:
                new_token_ids = tokens  # the caller's row, shared: neither side changes it
                request.output_token_ids.append(tokens[0])
                check_stop(request)
            else:
                request.num_computed_tokens += len(tokens) - 1
                new_token_ids = []
                for token_id in tokens:
                    request.output_token_ids.append(token_id)
                    new_token_ids.append(token_id)
                    if check_stop(request):
                        break
                # Blocks filled by accepted drafts: the known tokens' blocks were registered at allocation.
                self.kv_cache_manager.cache_blocks(request, request.num_computed_tokens)
            timing = request.timing
            if timing.first_token_time is None:
                timing.first_token_time = now
                self.num_prompt_tokens += len(request.prompt_token_ids)
            num_generation_tokens += len(new_token_ids)
            row_logprobs = logprobs[row - 1] if logprobs is not None else None
            output = EngineCoreOutput(  # positional: keyword arguments cost ~0.1 us more per request
                request.request_id,
                new_token_ids,
                row_logprobs[: len(new_token_ids)] if row_logprobs is not None else None,
                len(request.prompt_token_ids),
            )
            if request.status is not running_status:
                num_stopped += 1
                self._release(request)
                output.finish_reason = request.status.finish_reason
                output.stop_reason = request.stop_reason
                output.timing = timing
            outputs.append(output)
        self.num_generation_tokens += num_generation_tokens
        if num_stopped:  # one pass over the running list, in place (EngineCore hands it to the drafter)
            self.running[:] = [r for r in self.running if r.status not in FINISHED_STATUSES]
        return outputs

    # ---------------------------------------------------------------- internals

    def _allocate(
        self,
        request: Request,
        num_new_tokens: int,
        hit_blocks: list[KVCacheBlock] | None = None,
        num_hit_tokens: int = 0,
        num_lookahead_tokens: int = 0,
    ) -> bool:
        """Reserve slots for `num_new_tokens` known tokens (after `num_hit_tokens` prefix hits) and the drafts.

        The known tokens' full blocks enter the prefix cache now, as the step that computes them is planned: a
        request admitted later in this same step may hit them, because every attention backend writes a layer's
        new KV before that layer attends. Drafts never do: a rejected draft's KV is overwritten by the next step.
        """
        manager = self.kv_cache_manager
        if manager.allocate_slots(request, num_new_tokens, hit_blocks, num_hit_tokens, num_lookahead_tokens) is None:
            return False
        request.num_computed_tokens += num_hit_tokens
        manager.cache_blocks(request, request.num_computed_tokens + num_new_tokens)
        return True

    def _drafts_within_limits(self, request: Request, num_new_tokens: int, budget: int) -> list[int]:
        """Take the request's drafts for this step, cut to the token budget, max_model_len and max_tokens.

        Drafts only follow a request whose known tokens all run this step; the last draft's position stays below
        the request's final length, so its KV slot lies inside the reservation add_request checked.
        """
        drafts, request.spec_token_ids = request.spec_token_ids, []
        if not drafts or request.num_computed_tokens + num_new_tokens < request.num_tokens:
            return []
        final_len = min(request.num_prompt_tokens + request.max_tokens, self.max_model_len)
        room = min(budget - num_new_tokens, final_len - request.num_tokens - 1)
        return drafts[: max(room, 0)]

    def _grammar_ready(self, request: Request) -> bool:
        manager = self.structured_output_manager
        return manager is None or manager.grammar_ready(request)

    def _check_stop(self, request: Request) -> bool:
        """vLLM's finish rules, checked after each appended token."""
        num_output = len(request.output_token_ids)
        if num_output >= request.max_tokens or num_output + len(request.prompt_token_ids) >= self.max_model_len:
            request.status = RequestStatus.FINISHED_LENGTH
            return True
        params = request.sampling_params
        # The sampler masks stop ids until min_tokens, unless a complete grammar allows nothing else: a constrained
        # request's stop id therefore always ends it.
        if num_output <= params.min_tokens and params.structured_outputs is None:
            return False
        last_token_id = request.output_token_ids[-1]
        if not params.ignore_eos and last_token_id == request.eos_token_id:
            request.status = RequestStatus.FINISHED_STOPPED
            return True
        if last_token_id in params.stop_token_ids:
            request.status = RequestStatus.FINISHED_STOPPED
            request.stop_reason = last_token_id
            return True
        return False

    def _preempt(self, request: Request) -> None:
        request.status = RequestStatus.PREEMPTED
        self.kv_cache_manager.free(request)
        request.num_computed_tokens = 0
        request.timing.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def _release(self, request: Request) -> None:
        """Bookkeeping for a request that just finished (its status is already final)."""
        self.kv_cache_manager.free(request)
        request.timing.finished_time = time.monotonic()
        del self.requests[request.request_id]
        self.finished_req_ids.add(request.request_id)

    def reset_prefix_cache(self) -> bool:
        return self.kv_cache_manager.reset_prefix_cache()

    def get_stats(self) -> SchedulerStats:
        kv = self.kv_cache_manager
        return SchedulerStats(
            num_running_reqs=len(self.running),
            num_waiting_reqs=len(self.waiting),
            kv_cache_usage=kv.usage,
            prefix_cache_queries=kv.prefix_cache_queries,
            prefix_cache_hits=kv.prefix_cache_hits,
            num_preemptions=self.num_preemptions,
            num_prompt_tokens=self.num_prompt_tokens,
            num_generation_tokens=self.num_generation_tokens,
        )
