"""Per-request block tables over the BlockPool, with prefix caching (vLLM v1's KVCacheManager).

Invariants:
- a request's block table only grows while it runs; it is released whole (tail first) on finish/preemption;
- block i of a request holds the KV of token positions [i*block_size, (i+1)*block_size);
- a block enters the prefix cache once a scheduled step is about to write KV for all its tokens, and only for
  known tokens (never drafts); a hit in that same step reads the block after each layer's KV write, since
  attention backends write a layer's new KV before that layer attends.
"""

from __future__ import annotations

from engine.block_pool import BlockHash, BlockPool, KVCacheBlock, hash_full_blocks
from engine.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_blocks, enable_caching)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # The same tables as ids. A list here is replaced, never changed in place, when its table grows: a step's
        # SchedulerOutput shares it instead of copying it (tables grow once per block_size decode steps).
        self.req_to_block_ids: dict[str, list[int]] = {}
        # Per request: a step that leaves it at most this many tokens with KV needs no allocate_slots/cache_blocks
        # call (its slots exist and it fills no unregistered block). The scheduler's decode fast path reads it.
        self.req_to_slot_limit: dict[str, int] = {}
        # Hash chain of each request's full blocks, grown as tokens arrive; kept across preemption.
        self.req_to_block_hashes: dict[str, list[BlockHash]] = {}
        # How many leading blocks of each request are already registered in the prefix cache.
        self.num_cached_blocks: dict[str, int] = {}
        self.prefix_cache_queries = 0  # tokens looked up at admission (cumulative)
        self.prefix_cache_hits = 0  # of those, tokens found in the cache

    @property
    def num_blocks(self) -> int:
        return self.block_pool.num_blocks

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def num_free_blocks(self) -> int:
        return self.block_pool.get_num_free_blocks()

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table as ids, shared rather than copied: the manager never changes this list (a
        grown table is a new list), so it stays the table as of now. Callers must not mutate it."""
        return self.req_to_block_ids.get(request_id, [])

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The longest cached prefix of a new request, in whole blocks, never covering its last token
        (that token's logits must be computed). Returns the blocks and the number of tokens they hold.

        A request asking for prompt logprobs gets no hits: every prompt position's logits must be computed."""
        if not self.enable_caching or request.sampling_params.prompt_logprobs is not None:
            return [], 0
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        hashes = self._block_hashes(request, request.num_tokens // self.block_size)
        hits: list[KVCacheBlock] = []
        for block_hash in hashes[:max_hit_blocks]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: list[KVCacheBlock] | None = None,
        num_new_computed_tokens: int = 0,
        num_lookahead_tokens: int = 0,
    ) -> list[KVCacheBlock] | None:
        """Make room for `num_new_tokens` more tokens (after `num_new_computed_tokens` prefix-cache hits
        passed in as `new_computed_blocks`, and `num_lookahead_tokens` speculative slots).

        Returns the newly allocated blocks, or None (and changes nothing) if the pool is short.
        """
        request_id = request.request_id
        hits = new_computed_blocks or []
        blocks = self.req_to_blocks.get(request_id)
        num_held = len(blocks) + len(hits) if blocks is not None else len(hits)
        num_tokens_after = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        num_required = -(-(num_tokens_after + num_lookahead_tokens) // self.block_size) - num_held  # cdiv
        if num_required <= 0 and not hits and blocks:
            return []  # the common decode step: its slots are already reserved
        free_queue = self.block_pool.free_block_queue
        # Hits sitting in the free queue stop being allocatable once touched.
        num_free_hits = sum(1 for block in hits if block.ref_cnt == 0) if hits else 0
        if num_required > len(free_queue) - num_free_hits:
            return None
        if self.enable_caching and request.num_computed_tokens == 0 and not blocks:
            self.prefix_cache_queries += request.num_tokens
            self.prefix_cache_hits += num_new_computed_tokens
        if blocks is None:
            blocks = self.req_to_blocks[request_id] = []
        if hits:  # before get_new_blocks, which must not take a hit from the free queue
            self.block_pool.touch(hits)
            blocks += hits
            num_cached = self.num_cached_blocks.get(request_id, 0)
            self.num_cached_blocks[request_id] = max(num_cached, len(hits))
        new_blocks = self.block_pool.get_new_blocks(num_required) if num_required > 0 else []
        if hits or new_blocks:
            blocks += new_blocks
            self.req_to_block_ids[request_id] = self.req_to_block_ids.get(request_id, []) + [
                block.block_id for block in (hits + new_blocks if hits else new_blocks)
            ]
        self._update_slot_limit(request_id)
        return new_blocks

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Register the request's blocks that are full once its first `num_tokens` known tokens have KV."""
        if not self.enable_caching:
            return
        request_id = request.request_id
        num_full = min(num_tokens, request.num_tokens) // self.block_size
        start = self.num_cached_blocks.get(request_id, 0)
        if num_full <= start:
            return
        hashes = self._block_hashes(request, num_full)
        blocks = self.req_to_blocks[request_id]
        for index in range(start, num_full):
            self.block_pool.cache_full_block(blocks[index], hashes[index])
        self.num_cached_blocks[request_id] = num_full
        self._update_slot_limit(request_id)

    def free(self, request: Request) -> None:
        """Release a request's blocks, tail first. Cached ones stay reusable until evicted."""
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.req_to_block_ids.pop(request.request_id, None)
        self.req_to_slot_limit.pop(request.request_id, None)
        self.block_pool.free_blocks(reversed(blocks))
        self.num_cached_blocks.pop(request.request_id, None)
        if request.is_finished:
            self.req_to_block_hashes.pop(request.request_id, None)

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()

    def _update_slot_limit(self, request_id: str) -> None:
        num_slots = len(self.req_to_blocks[request_id]) * self.block_size
        if self.enable_caching:  # the next block to register fills at its last token
            num_slots = min(num_slots, (self.num_cached_blocks.get(request_id, 0) + 1) * self.block_size - 1)
        self.req_to_slot_limit[request_id] = num_slots

    def _block_hashes(self, request: Request, num_blocks: int) -> list[BlockHash]:
        """The hash chain of the request's first `num_blocks` full blocks (at least), extended in place: only the
        new blocks' tokens are sliced and hashed."""
        hashes = self.req_to_block_hashes.setdefault(request.request_id, [])
        if len(hashes) < num_blocks:
            start, end = len(hashes) * self.block_size, num_blocks * self.block_size
            prompt, num_prompt = request.prompt_token_ids, request.num_prompt_tokens
            if end <= num_prompt:
                token_ids = prompt[start:end]
            elif start >= num_prompt:  # decode: output tokens only
                token_ids = request.output_token_ids[start - num_prompt : end - num_prompt]
            else:
                token_ids = prompt[start:] + request.output_token_ids[max(start - num_prompt, 0) : end - num_prompt]
            hashes += hash_full_blocks(token_ids, self.block_size, parent=hashes[-1] if hashes else None)
        return hashes
