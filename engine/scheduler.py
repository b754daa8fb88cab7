"""vLLM v1 style scheduler: one phase-less step under a token budget.

Each request only knows how many of its tokens have KV in the cache (num_computed_tokens); a step gives
every request the tokens it still lacks, within max_num_batched_tokens and max_num_seqs. Decodes,
continuing prefill chunks and fresh prompts therefore share one batch. Running requests go first, then
waiting ones in arrival order. When the KV pool runs dry, the most recently admitted running request is
preempted by recompute: its blocks are freed (their cached prefixes usually make the re-prefill cheap)
and it goes back to the front of the queue.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable

from engine.config import CacheConfig, SchedulerConfig
from engine.kv_cache_manager import KVCacheManager, cdiv
from engine.outputs import EngineCoreOutput, Logprob, SchedulerStats
from engine.request import Request, RequestStatus
from engine.scheduler_output import ScheduledRequest, SchedulerOutput


class Scheduler:
    def __init__(
        self,
        scheduler_config: SchedulerConfig,
        cache_config: CacheConfig,
        max_model_len: int,
        num_gpu_blocks: int,
    ) -> None:
        self.scheduler_config = scheduler_config
        self.max_model_len = max_model_len
        self.block_size = cache_config.block_size
        self.kv_cache_manager = KVCacheManager(
            num_gpu_blocks, cache_config.block_size, cache_config.enable_prefix_caching
        )
        self.requests: dict[str, Request] = {}  # every unfinished request
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order: the tail is the preemption victim
        self.finished_req_ids: set[str] = set()  # finished since the last schedule(), for the runner
        self.num_preemptions = 0
        self.num_prompt_tokens = 0
        self.num_generation_tokens = 0

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
        budget = self.scheduler_config.max_num_batched_tokens
        scheduled: list[tuple[Request, int]] = []
        preempted: list[Request] = []

        # Running requests first: decodes (1 token) and continuing prefill chunks.
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            num_new_tokens = min(request.num_tokens - request.num_computed_tokens, budget)
            assert num_new_tokens > 0, f"running request {request.request_id} has nothing to compute"
            while self.kv_cache_manager.allocate_slots(request, num_new_tokens) is None:
                # Victims come from the tail, past `index`, so none of them was scheduled yet this step.
                victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is request:
                    break
            if request.status != RequestStatus.RUNNING:
                break
            scheduled.append((request, num_new_tokens))
            budget -= num_new_tokens
            index += 1

        # Then waiting requests, first come first served; none after a preemption (the pool is tight).
        now = time.monotonic()
        while not preempted and self.waiting and budget > 0:
            if len(self.running) >= self.scheduler_config.max_num_seqs:
                break
            request = self.waiting[0]
            hit_blocks, num_hit_tokens = self.kv_cache_manager.get_computed_blocks(request)
            num_new_tokens = request.num_tokens - num_hit_tokens
            if not self.scheduler_config.enable_chunked_prefill and num_new_tokens > budget:
                break
            num_new_tokens = min(num_new_tokens, budget)
            if self.kv_cache_manager.allocate_slots(request, num_new_tokens, hit_blocks, num_hit_tokens) is None:
                break
            self.waiting.popleft()
            self.running.append(request)
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = num_hit_tokens
            if request.timing.first_scheduled_time is None:
                request.timing.first_scheduled_time = now
                request.timing.num_cached_tokens = num_hit_tokens
            scheduled.append((request, num_new_tokens))
            budget -= num_new_tokens

        output = SchedulerOutput(
            scheduled=[
                ScheduledRequest(request, n, self.kv_cache_manager.get_block_ids(request.request_id))
                for request, n in scheduled
            ],
            total_num_scheduled_tokens=sum(n for _, n in scheduled),
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
        """Apply one executed step: advance num_computed_tokens, append the sampled tokens, finish requests.

        `sampled_token_ids[i]` (and `logprobs[i]`, one entry per token) belong to
        `scheduler_output.sampling_requests()[i]`. A list per request, so a speculative step's accepted
        tokens fit; the rejected drafts' KV is then rolled back by advancing num_computed_tokens less.
        """
        sampling = scheduler_output.sampling_requests()  # must be read before num_computed_tokens moves
        if len(sampled_token_ids) != len(sampling):
            raise ValueError(f"{len(sampled_token_ids)} sampled rows for {len(sampling)} sampling requests")
        for scheduled in scheduler_output.scheduled:
            request = scheduled.request
            if request.is_finished:
                continue
            request.num_computed_tokens += scheduled.num_scheduled_tokens
            self.kv_cache_manager.cache_blocks(request)

        now = time.monotonic()
        outputs = []
        for row, scheduled in enumerate(sampling):
            request = scheduled.request
            if request.is_finished:
                continue
            new_token_ids = []
            for token_id in sampled_token_ids[row]:
                request.output_token_ids.append(token_id)
                new_token_ids.append(token_id)
                if self._check_stop(request):
                    break
            if request.timing.first_token_time is None:
                request.timing.first_token_time = now
                self.num_prompt_tokens += request.num_prompt_tokens
            self.num_generation_tokens += len(new_token_ids)
            row_logprobs = logprobs[row] if logprobs is not None else None
            output = EngineCoreOutput(
                request_id=request.request_id,
                new_token_ids=new_token_ids,
                new_logprobs=row_logprobs[: len(new_token_ids)] if row_logprobs is not None else None,
                num_prompt_tokens=request.num_prompt_tokens,
            )
            if request.is_finished:
                self.running.remove(request)
                self._release(request)
                output.finish_reason = request.status.finish_reason
                output.stop_reason = request.stop_reason
                output.timing = request.timing
            outputs.append(output)
        return outputs

    # ---------------------------------------------------------------- internals

    def _check_stop(self, request: Request) -> bool:
        """vLLM's finish rules, checked after each appended token."""
        if request.num_tokens >= self.max_model_len or request.num_output_tokens >= request.max_tokens:
            request.status = RequestStatus.FINISHED_LENGTH
            return True
        params = request.sampling_params
        if request.num_output_tokens <= params.min_tokens:  # the sampler masks stop ids until then
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
