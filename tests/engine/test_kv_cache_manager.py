"""KV cache manager: prefix hits, counters, allocation failure; block invariants under random traffic.

The property test drives the real Scheduler with a fake model runner that stores, per KV slot, the token
prefix whose KV it would hold, and proposes right and wrong drafts. Every step it checks that each scheduled
request reads exactly its own prefix at every position (so a prefix-cache hit, even on a block computed in the
same step, never reads stale, foreign or rejected-draft KV), that drafts are written only into the request's
own uncached blocks, that reference counts match the block tables, that the id tables and the decode fast path's
slot limits agree with the block tables, that a step's shared block tables never change afterwards, and that the
outputs equal the fake model's own continuation.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from engine.engine_core import accept_drafts
from engine.kv_cache_manager import KVCacheManager
from engine.request import Request
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.scheduler_output import SchedulerOutput

EOS = 0


def make_request(request_id: str, prompt: list[int], max_tokens: int = 4, **params: object) -> Request:
    return Request(request_id, prompt, SamplingParams(max_tokens=max_tokens, **params), EOS, max_tokens)


def test_hits_are_whole_blocks_and_never_the_whole_prompt() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_caching=True)
    first = make_request("a", list(range(1, 9)))  # exactly 2 full blocks
    assert kv.get_computed_blocks(first) == ([], 0)
    assert kv.allocate_slots(first, 8) is not None
    first.num_computed_tokens = 8
    kv.cache_blocks(first, 8)

    same = make_request("b", list(range(1, 9)))
    blocks, num_hit = kv.get_computed_blocks(same)
    assert num_hit == 4  # the last block would cover the last prompt token: not a hit
    assert [b.block_id for b in blocks] == kv.get_block_ids("a")[:1]

    longer = make_request("c", list(range(1, 10)))
    blocks, num_hit = kv.get_computed_blocks(longer)
    assert num_hit == 8 and [b.block_id for b in blocks] == kv.get_block_ids("a")
    assert kv.allocate_slots(longer, 1, blocks, num_hit) is not None
    assert kv.prefix_cache_queries == 8 + 9 and kv.prefix_cache_hits == 8
    assert [b.ref_cnt for b in blocks] == [2, 2]


def test_only_full_blocks_of_known_tokens_enter_the_cache() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_caching=True)
    request = make_request("a", list(range(1, 11)))
    kv.allocate_slots(request, 6)  # a 6-token chunk fills one block
    kv.cache_blocks(request, 6)
    assert kv.get_computed_blocks(make_request("b", list(range(1, 11))))[1] == 4
    request.num_computed_tokens = 6
    kv.allocate_slots(request, 4, num_lookahead_tokens=2)  # the prompt's rest and 2 drafts
    kv.cache_blocks(request, 10 + 2)  # past the known tokens: only the known ones count
    assert kv.get_computed_blocks(make_request("c", list(range(1, 11)) + [7, 7]))[1] == 8
    assert len(kv.get_block_ids("a")) == 3  # the drafts' slots are reserved in a third block


def test_allocation_failure_changes_nothing() -> None:
    kv = KVCacheManager(num_blocks=3, block_size=4, enable_caching=True)
    holder = make_request("a", list(range(1, 9)))
    kv.allocate_slots(holder, 8)
    holder.num_computed_tokens = 8
    kv.cache_blocks(holder, 8)
    kv.free(holder)  # 3 free blocks, 2 of them cached
    other = make_request("b", list(range(1, 9)) + [50] * 8)  # 16 tokens: 2 hits + 2 new blocks > 3 free
    blocks, num_hit = kv.get_computed_blocks(other)
    assert num_hit == 8
    assert kv.allocate_slots(other, 8, blocks, num_hit) is None
    assert kv.num_free_blocks() == 3 and all(b.ref_cnt == 0 for b in blocks)
    assert kv.get_block_ids("b") == [] and kv.prefix_cache_queries == 8  # only "a" was admitted


def test_usage_and_reset() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=4, enable_caching=True)
    request = make_request("a", list(range(1, 9)))
    kv.allocate_slots(request, 8)
    assert kv.usage == 0.5
    request.num_computed_tokens = 8
    kv.cache_blocks(request, 8)
    assert kv.reset_prefix_cache() is False
    kv.free(request)
    assert kv.usage == 0.0 and kv.reset_prefix_cache() is True
    assert kv.get_computed_blocks(make_request("b", list(range(1, 10))))[1] == 0


# ------------------------------------------------------------------ property test


def next_token(tokens: list[int]) -> int:
    """The fake model: a deterministic function of the whole context, so recompute gives the same token."""
    return (sum(tokens) * 7 + len(tokens) * 3) % 11


def reference_output(request: Request, max_model_len: int) -> list[int]:
    tokens, out = list(request.prompt_token_ids), []
    while True:
        token = next_token(tokens)
        tokens.append(token)
        out.append(token)
        if len(tokens) >= max_model_len or len(out) >= request.max_tokens:
            return out
        if token == EOS and not request.sampling_params.ignore_eos:
            return out


class FakeRunner:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.kv: dict[int, tuple[int, ...]] = {}  # slot -> the token prefix whose last KV it holds

    def slot(self, block_ids: list[int], position: int) -> int:
        return block_ids[position // self.block_size] * self.block_size + position % self.block_size

    def execute(self, output: SchedulerOutput, scheduler: Scheduler) -> list[list[int]]:
        """Like an attention layer: every scheduled token's KV is written first, then every token reads its context
        (a hit on a block another request computes in this same step reads it after the write)."""
        blocks = scheduler.kv_cache_manager.block_pool.blocks
        for s in output.scheduled:
            tokens, computed = s.request.all_token_ids + s.spec_token_ids, s.request.num_computed_tokens
            assert len(s.block_ids) * self.block_size >= computed + s.num_scheduled_tokens
            for position in range(computed, computed + s.num_scheduled_tokens):
                block = blocks[s.block_ids[position // self.block_size]]
                if position >= len(s.request.all_token_ids):
                    assert block.ref_cnt == 1 and block.block_hash is None, f"a draft written into shared {block}"
                self.kv[self.slot(s.block_ids, position)] = tuple(tokens[: position + 1])
        for s in output.scheduled:
            tokens, computed = s.request.all_token_ids + s.spec_token_ids, s.request.num_computed_tokens
            for position in range(computed + s.num_scheduled_tokens):
                assert self.kv.get(self.slot(s.block_ids, position)) == tuple(tokens[: position + 1])
        accepted = []
        for s in output.sampling_requests():
            tokens, drafts = s.request.all_token_ids, s.spec_token_ids
            rows = [next_token(tokens + drafts[:j]) for j in range(len(drafts) + 1)]
            accepted.append(accept_drafts(drafts, rows))
        return accepted


def check_block_invariants(scheduler: Scheduler) -> None:
    kv = scheduler.kv_cache_manager
    pool = kv.block_pool
    owners: dict[int, list[str]] = {}
    for request_id, blocks in kv.req_to_blocks.items():
        assert request_id in scheduler.requests
        for block in blocks:
            owners.setdefault(block.block_id, []).append(request_id)
    for block in pool.blocks:
        holders = owners.get(block.block_id, [])
        assert block.ref_cnt == len(holders), block
        assert (block.ref_cnt == 0) == (block in pool.free_block_queue), block
        if len(holders) > 1:
            assert block.block_hash is not None, f"{block} owned twice without being a cached prefix"
    for block_hash, block in pool.cached_block_hash_to_block.items():
        assert block.block_hash == block_hash
    assert kv.req_to_slot_limit.keys() == kv.req_to_blocks.keys()
    for request_id, blocks in kv.req_to_blocks.items():
        assert kv.req_to_block_ids.get(request_id, []) == [block.block_id for block in blocks]
        limit = len(blocks) * kv.block_size  # the decode fast path's bound: slots exist, no block left to register
        if kv.enable_caching:
            limit = min(limit, (kv.num_cached_blocks.get(request_id, 0) + 1) * kv.block_size - 1)
        assert kv.req_to_slot_limit[request_id] == limit
    for request in scheduler.running:
        assert len(kv.req_to_blocks[request.request_id]) * kv.block_size >= request.num_computed_tokens
    for request in scheduler.waiting:
        assert request.request_id not in kv.req_to_blocks and request.num_computed_tokens == 0


PREFIXES = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9], [5, 5, 5, 5, 5]]
add_op = st.tuples(
    st.just("add"), st.integers(0, len(PREFIXES)), st.lists(st.integers(1, 10), max_size=12), st.integers(1, 16)
)
abort_op = st.tuples(st.just("abort"), st.integers(0, 50))
step_op = st.tuples(st.just("step"), st.integers(1, 3))
# Drafts for every running request's next step: `good` right ones (the fake model's continuation), then wrong ones.
draft_op = st.tuples(st.just("draft"), st.integers(0, 4), st.integers(0, 4))


def propose(request: Request, num_good: int, num_bad: int) -> list[int]:
    tokens, drafts = list(request.all_token_ids), []
    for index in range(num_good + num_bad):
        token = next_token(tokens)
        drafts.append(token if index < num_good else (token + 1) % 11)
        tokens.append(drafts[-1])
    return drafts


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(st.one_of(add_op, abort_op, step_op, draft_op), min_size=1, max_size=40),
    num_blocks=st.integers(4, 16),
    max_num_batched_tokens=st.integers(4, 40),
    max_num_seqs=st.integers(1, 6),
    enable_chunked_prefill=st.booleans(),
    enable_prefix_caching=st.booleans(),
    ignore_eos=st.booleans(),
)
def test_block_invariants_under_random_traffic(
    ops: list[tuple],
    num_blocks: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    enable_chunked_prefill: bool,
    enable_prefix_caching: bool,
    ignore_eos: bool,
) -> None:
    block_size, max_model_len = 4, 32
    if not enable_chunked_prefill:
        max_num_batched_tokens = max(max_num_batched_tokens, max_model_len)
    config = EngineConfig(
        model_config=ModelConfig(model="tiny-random", max_model_len=max_model_len),
        cache_config=CacheConfig(block_size=block_size, enable_prefix_caching=enable_prefix_caching),
        scheduler_config=SchedulerConfig(max_num_seqs, max_num_batched_tokens, enable_chunked_prefill),
    )
    scheduler = Scheduler(config, num_blocks)
    runner = FakeRunner(block_size)
    added: list[Request] = []
    outputs: dict[str, list[int]] = {}
    aborted: set[str] = set()

    earlier_tables: list[tuple[list[int], list[int]]] = []  # the last step's shared block-id lists, and copies

    def step() -> None:
        output = scheduler.schedule()
        # A step's block tables are shared with the KV manager, which replaces a grown table rather than change it.
        assert all(shared == copy for shared, copy in earlier_tables)
        earlier_tables[:] = [(s.block_ids, list(s.block_ids)) for s in output.scheduled]
        assert output.total_num_scheduled_tokens <= max_num_batched_tokens
        assert len(output.scheduled) <= max_num_seqs and len(scheduler.running) <= max_num_seqs
        if not enable_chunked_prefill:
            assert all(s.request.num_computed_tokens + s.num_scheduled_tokens - len(s.spec_token_ids)
                       == s.request.num_tokens for s in output.scheduled)
        for core_output in scheduler.update_from_output(output, runner.execute(output, scheduler)):
            outputs.setdefault(core_output.request_id, []).extend(core_output.new_token_ids)
        check_block_invariants(scheduler)

    for op in ops:
        if op[0] == "add":
            _, prefix_index, suffix, max_tokens = op
            prompt = (PREFIXES[prefix_index] if prefix_index < len(PREFIXES) else []) + suffix
            request = make_request(f"r{len(added)}", prompt, max_tokens, ignore_eos=ignore_eos)
            added.append(request)
            try:
                scheduler.add_request(request)
            except ValueError:
                assert request.request_id not in scheduler.requests
                aborted.add(request.request_id)
        elif op[0] == "draft":
            for request in scheduler.running:
                request.spec_token_ids = propose(request, op[1], op[2])
        elif op[0] == "abort" and added:
            request_id = added[op[1] % len(added)].request_id
            if request_id in scheduler.requests:
                aborted.add(request_id)
            scheduler.finish_requests([request_id])
            check_block_invariants(scheduler)
        else:
            for _ in range(op[1]):
                step()

    for _ in range(1000):
        if not scheduler.has_unfinished_requests():
            break
        step()
    assert not scheduler.has_unfinished_requests(), "the queue hung"
    pool = scheduler.kv_cache_manager.block_pool
    assert all(block.ref_cnt == 0 for block in pool.blocks)
    assert pool.get_num_free_blocks() == num_blocks and scheduler.kv_cache_manager.req_to_blocks == {}
    for request in added:
        if request.request_id not in aborted:
            assert request.is_finished
            assert outputs[request.request_id] == reference_output(request, max_model_len)
            assert request.output_token_ids == outputs[request.request_id]
