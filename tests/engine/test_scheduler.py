"""Scheduler: token budget and sequence cap, chunked prefill, preemption order, finish rules, rejection."""

from __future__ import annotations

import pytest

from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from engine.outputs import EngineCoreOutput
from engine.request import Request, RequestStatus
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.scheduler_output import SchedulerOutput

EOS = 2


def make_scheduler(
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 64,
    enable_chunked_prefill: bool = True,
    num_blocks: int = 64,
    max_model_len: int = 64,
    enable_prefix_caching: bool = True,
) -> Scheduler:
    config = EngineConfig(
        model_config=ModelConfig(model="tiny-random", max_model_len=max_model_len),
        cache_config=CacheConfig(block_size=4, enable_prefix_caching=enable_prefix_caching),
        scheduler_config=SchedulerConfig(max_num_seqs, max_num_batched_tokens, enable_chunked_prefill),
    )
    return Scheduler(config, num_blocks)


def make_request(request_id: str, num_prompt: int, max_tokens: int = 8, start: int = 10, **params: object) -> Request:
    prompt = list(range(start, start + num_prompt))
    return Request(request_id, prompt, SamplingParams(max_tokens=max_tokens, **params), EOS, max_tokens)


def plan(output: SchedulerOutput) -> dict[str, int]:
    return {s.request.request_id: s.num_scheduled_tokens for s in output.scheduled}


def run_step(scheduler: Scheduler, token: int = 5) -> tuple[SchedulerOutput, list[EngineCoreOutput]]:
    output = scheduler.schedule()
    return output, scheduler.update_from_output(output, [[token] for _ in output.sampling_requests()])


def test_budget_and_sequence_cap() -> None:
    scheduler = make_scheduler(max_num_seqs=3, max_num_batched_tokens=16)
    for i in range(5):
        scheduler.add_request(make_request(f"r{i}", 10, start=100 * i))
    first, outputs = run_step(scheduler)
    assert plan(first) == {"r0": 10, "r1": 6}  # r1's prompt is cut to fit the budget
    assert [o.request_id for o in outputs] == ["r0"]  # a partial chunk samples nothing
    second, _ = run_step(scheduler)
    assert plan(second) == {"r0": 1, "r1": 4, "r2": 10}  # running first (decode, then the chunk's rest)
    third, _ = run_step(scheduler)
    assert plan(third) == {"r0": 1, "r1": 1, "r2": 1}  # max_num_seqs=3 keeps r3 waiting
    assert [r.request_id for r in scheduler.waiting] == ["r3", "r4"]
    assert all(o.total_num_scheduled_tokens <= 16 for o in (first, second, third))


def test_chunked_prefill_splits_a_long_prompt_and_samples_once() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=16)
    scheduler.add_request(make_request("long", 40, max_tokens=2))
    chunks = []
    while scheduler.has_unfinished_requests():
        output, outputs = run_step(scheduler)
        chunks.append((plan(output)["long"], [o.new_token_ids for o in outputs]))
    assert chunks == [(16, []), (16, []), (8, [[5]]), (1, [[5]])]


def test_without_chunked_prefill_a_prompt_runs_whole_or_waits() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=64, enable_chunked_prefill=False)
    scheduler.add_request(make_request("a", 40))
    scheduler.add_request(make_request("b", 30, start=100))
    scheduler.add_request(make_request("c", 10, start=200))
    output, _ = run_step(scheduler)
    assert plan(output) == {"a": 40}  # b does not fit the rest of the budget; c waits behind it (FCFS)
    output, _ = run_step(scheduler)
    assert plan(output) == {"a": 1, "b": 30, "c": 10}


def test_preemption_takes_the_most_recently_admitted_and_requeues_it_first() -> None:
    scheduler = make_scheduler(num_blocks=6, enable_prefix_caching=False)
    for i in range(3):
        scheduler.add_request(make_request(f"r{i}", 8, max_tokens=4))  # 2 blocks each: the pool is full
    scheduler.add_request(make_request("late", 3, max_tokens=1))
    run_step(scheduler)
    victim = scheduler.requests["r2"]
    output, outputs = run_step(scheduler)  # r0 and r1 each need a third block
    assert output.preempted_request_ids == ["r2"]
    assert plan(output) == {"r0": 1, "r1": 1}  # no admission in a step that preempted
    assert victim.status == RequestStatus.PREEMPTED and victim.num_computed_tokens == 0
    assert victim.output_token_ids == [5]  # generated tokens survive a preemption
    assert victim.timing.num_preemptions == 1 and scheduler.get_stats().num_preemptions == 1
    assert [r.request_id for r in scheduler.waiting] == ["r2", "late"]
    assert scheduler.kv_cache_manager.get_block_ids("r2") == []

    finished: dict[str, EngineCoreOutput] = {}
    while scheduler.has_unfinished_requests():
        output, outputs = run_step(scheduler)
        if "r2" in plan(output) and victim.num_computed_tokens == 9 and len(victim.output_token_ids) == 2:
            assert plan(output)["r2"] == 9  # recompute: prompt + the generated token
        finished.update({o.request_id: o for o in outputs if o.finish_reason})
    assert {k: v.finish_reason for k, v in finished.items()} == dict.fromkeys(["r0", "r1", "r2", "late"], "length")
    assert victim.output_token_ids == [5] * 4
    assert scheduler.kv_cache_manager.num_free_blocks() == 6


def test_the_request_being_scheduled_can_be_its_own_victim() -> None:
    scheduler = make_scheduler(num_blocks=3, enable_prefix_caching=False)
    scheduler.add_request(make_request("a", 4, max_tokens=8))  # grows to 11 KV tokens = the whole pool
    scheduler.add_request(make_request("b", 4, max_tokens=2, start=100))
    run_step(scheduler)
    output, _ = run_step(scheduler)  # a takes the last free block; b, the tail, then preempts itself
    assert plan(output) == {"a": 1} and output.preempted_request_ids == ["b"]
    preempted, order = [], []
    while scheduler.has_unfinished_requests():
        output, outputs = run_step(scheduler)
        preempted += output.preempted_request_ids
        order += [o.request_id for o in outputs if o.finish_reason]
    assert preempted == [] and order == ["a", "b"]
    assert scheduler.kv_cache_manager.num_free_blocks() == 3


def test_resumed_request_hits_its_own_cached_blocks() -> None:
    scheduler = make_scheduler(num_blocks=7, enable_prefix_caching=True)
    for i in range(3):
        scheduler.add_request(make_request(f"r{i}", 8, max_tokens=4, start=10 * i + 10))
    run_step(scheduler)
    output, _ = run_step(scheduler)  # r0 takes the free block; r1 needs r2's tail block
    assert output.preempted_request_ids == ["r2"]
    hits_before = scheduler.get_stats().prefix_cache_hits
    while "r2" not in plan(output):
        output, _ = run_step(scheduler)
    victim = scheduler.requests["r2"]
    # Its first block kept its cached KV while free; the recompute runs the other 5 of its 9 tokens.
    assert plan(output)["r2"] == 5 and victim.num_computed_tokens == 9
    assert scheduler.get_stats().prefix_cache_hits == hits_before + 4
    assert victim.timing.num_cached_tokens == 0  # recorded at the first schedule only


def test_up_front_rejection_never_hangs_the_queue() -> None:
    scheduler = make_scheduler(num_blocks=4, max_model_len=32)
    with pytest.raises(ValueError, match="max_model_len=32"):
        scheduler.add_request(make_request("too-long", 32))
    with pytest.raises(ValueError, match="KV cache holds only 4 blocks"):
        scheduler.add_request(make_request("too-big", 12, max_tokens=8))  # 19 KV tokens > 16
    with pytest.raises(ValueError, match="prompt is empty"):
        scheduler.add_request(make_request("empty", 0))
    scheduler.add_request(make_request("ok", 12, max_tokens=5))  # 16 KV tokens: exactly the pool
    with pytest.raises(ValueError, match="already in the engine"):
        scheduler.add_request(make_request("ok", 3))
    assert list(scheduler.requests) == ["ok"]
    while scheduler.has_unfinished_requests():
        run_step(scheduler)
    assert scheduler.kv_cache_manager.num_free_blocks() == 4


@pytest.mark.parametrize(
    ("params", "tokens", "expected"),
    [
        ({}, [7, EOS, 7], ([7, EOS], "stop", None)),
        ({"ignore_eos": True}, [7, EOS, 7, 7], ([7, EOS, 7, 7], "length", None)),
        ({"min_tokens": 2}, [EOS, EOS, EOS, 7], ([EOS, EOS, EOS], "stop", None)),
        ({"stop_token_ids": [9]}, [7, 9, 7], ([7, 9], "stop", 9)),
        ({}, [7, 7, 7, 7, 7], ([7, 7, 7, 7], "length", None)),
    ],
)
def test_finish_rules(params: dict, tokens: list[int], expected: tuple) -> None:
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a", 4, max_tokens=4, **params))
    got: list[int] = []
    for token in tokens:
        _, outputs = run_step(scheduler, token)
        got += outputs[0].new_token_ids
        if outputs[0].finish_reason:
            assert (got, outputs[0].finish_reason, outputs[0].stop_reason) == expected
            assert outputs[0].timing is not None and outputs[0].timing.finished_time is not None
            return
    raise AssertionError(f"never finished: {got}")


def test_max_model_len_caps_the_output() -> None:
    scheduler = make_scheduler(max_model_len=10)
    scheduler.add_request(make_request("a", 7, max_tokens=50, ignore_eos=True))
    outputs = []
    while scheduler.has_unfinished_requests():
        outputs += run_step(scheduler)[1]
    assert sum(len(o.new_token_ids) for o in outputs) == 3 and outputs[-1].finish_reason == "length"


def test_timing_counters_and_finished_ids() -> None:
    scheduler = make_scheduler()
    request = make_request("a", 4, max_tokens=1)
    scheduler.add_request(request)
    _, outputs = run_step(scheduler)
    timing = outputs[0].timing
    assert timing is not None and outputs[0].finish_reason == "length"
    assert timing.arrival_time <= timing.first_scheduled_time <= timing.first_token_time <= timing.finished_time
    assert scheduler.schedule().finished_request_ids == ["a"]
    stats = scheduler.get_stats()
    assert (stats.num_prompt_tokens, stats.num_generation_tokens, stats.num_running_reqs) == (4, 1, 0)


def test_abort_frees_blocks_at_once_running_or_waiting() -> None:
    scheduler = make_scheduler(max_num_seqs=1, num_blocks=8)
    scheduler.add_request(make_request("run", 8))
    scheduler.add_request(make_request("wait", 8))
    run_step(scheduler)
    assert scheduler.kv_cache_manager.num_free_blocks() == 6
    finished = scheduler.finish_requests(["run", "wait", "unknown"])
    assert [r.status for r in finished] == [RequestStatus.FINISHED_ABORTED] * 2
    assert scheduler.kv_cache_manager.num_free_blocks() == 8 and not scheduler.has_unfinished_requests()
    assert scheduler.schedule().is_empty


# ------------------------------------------------------------------ the step contract: sampling rows and drafts


def test_which_requests_sample_is_decided_once_by_the_scheduler() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=12)
    scheduler.add_request(make_request("long", 10))
    scheduler.add_request(make_request("short", 4, start=100))
    output = scheduler.schedule()
    assert [(s.request.request_id, s.sample) for s in output.scheduled] == [("long", True), ("short", False)]
    scheduler.update_from_output(output, [[5]])
    # num_computed_tokens moved: the flags, and so sampling_requests(), still describe the executed step.
    assert [s.request.request_id for s in output.sampling_requests()] == ["long"]


def test_drafts_are_scheduled_behind_the_known_token_with_their_kv_slots() -> None:
    scheduler = make_scheduler(num_blocks=16)
    request = make_request("a", 7, max_tokens=8)
    scheduler.add_request(request)
    run_step(scheduler)  # prefill: 7 prompt tokens, 1 output token
    request.spec_token_ids = [6, 7, 8]
    output = scheduler.schedule()
    (scheduled,) = output.scheduled
    assert (scheduled.num_scheduled_tokens, scheduled.spec_token_ids, scheduled.num_logits_rows) == (4, [6, 7, 8], 4)
    assert request.spec_token_ids == []  # moved onto the step
    assert len(scheduled.block_ids) * 4 >= 8 + 3  # slots for the known token at position 7 and drafts at 8..10
    assert output.total_num_scheduled_tokens == 4


def test_accepted_drafts_advance_num_computed_tokens_and_rejected_ones_never_enter_the_cache() -> None:
    scheduler = make_scheduler(num_blocks=16)
    request = make_request("a", 6, max_tokens=8)
    scheduler.add_request(request)
    run_step(scheduler, token=20)  # all tokens: 10..15, 20
    request.spec_token_ids = [21, 22, 23]  # positions 7, 8, 9
    output = scheduler.schedule()
    # The target agreed with draft 21, chose 30 where 22 was drafted: 22 and 23 are rejected.
    (core_output,) = scheduler.update_from_output(output, [[21, 30]])
    assert core_output.new_token_ids == [21, 30]
    assert request.output_token_ids == [20, 21, 30] and request.num_computed_tokens == 8  # 7 known + 1 accepted
    # Block 1 (positions 4..7) is full of known tokens and cached; block 2 held the rejected drafts: not cached.
    probe = make_request("probe", 12, start=10)
    probe.prompt_token_ids = [10, 11, 12, 13, 14, 15, 20, 21, 22, 23, 99, 99]
    assert scheduler.kv_cache_manager.get_computed_blocks(probe)[1] == 8
    # The next step recomputes position 8 with the accepted token, overwriting the rejected draft's slot.
    next_output = scheduler.schedule()
    assert next_output.scheduled[0].num_scheduled_tokens == 1 and request.num_computed_tokens == 8


def test_update_rejects_more_tokens_than_the_step_verified() -> None:
    scheduler = make_scheduler()
    request = make_request("a", 4)
    scheduler.add_request(request)
    run_step(scheduler)
    request.spec_token_ids = [1]
    output = scheduler.schedule()
    with pytest.raises(ValueError, match="3 tokens for a step with 1 drafts"):
        scheduler.update_from_output(output, [[1, 2, 3]])


def test_update_rejects_an_empty_row_next_to_one_token_rows_and_changes_nothing() -> None:
    scheduler = make_scheduler()
    for request_id in "ab":
        scheduler.add_request(make_request(request_id, 4))
    run_step(scheduler)
    output = scheduler.schedule()
    before = [(r.num_computed_tokens, list(r.output_token_ids)) for r in scheduler.running]
    with pytest.raises(ValueError, match="0 tokens for a step with 0 drafts"):
        scheduler.update_from_output(output, [[1], []])
    assert [(r.num_computed_tokens, list(r.output_token_ids)) for r in scheduler.running] == before


@pytest.mark.parametrize(
    ("budget", "max_tokens", "max_model_len", "expected"),
    [
        (64, 16, 64, [1, 2, 3, 4]),
        (3, 16, 64, [1, 2]),  # the token budget: 1 known token + 2 drafts
        (64, 3, 64, [1]),  # max_tokens=3 after 1 output: the known token's successor + 1 draft, then the bonus
        (64, 16, 7, [1]),  # max_model_len=7 after 4 prompt + 1 output tokens
    ],
)
def test_drafts_are_cut_to_the_budget_max_tokens_and_max_model_len(
    budget: int, max_tokens: int, max_model_len: int, expected: list[int]
) -> None:
    scheduler = make_scheduler(max_num_batched_tokens=budget, max_model_len=max_model_len)
    request = make_request("a", 4, max_tokens=max_tokens)
    scheduler.add_request(request)
    run_step(scheduler)
    request.spec_token_ids = [1, 2, 3, 4]
    assert scheduler.schedule().scheduled[0].spec_token_ids == expected


def test_a_partial_prefill_chunk_gets_no_drafts() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=4)
    request = make_request("a", 10)
    scheduler.add_request(request)
    run_step(scheduler)  # a 4-token chunk
    request.spec_token_ids = [1, 2]
    (scheduled,) = scheduler.schedule().scheduled
    assert scheduled.spec_token_ids == [] and not scheduled.sample


def test_requests_admitted_in_one_step_share_the_blocks_it_computes() -> None:
    scheduler = make_scheduler(num_blocks=16)
    for i in range(3):  # e.g. the n children of one prompt
        scheduler.add_request(make_request(f"child{i}", 9))
    output = scheduler.schedule()
    assert plan(output) == {"child0": 9, "child1": 1, "child2": 1}
    first_blocks = scheduler.kv_cache_manager.get_block_ids("child0")[:2]
    assert all(scheduler.kv_cache_manager.get_block_ids(f"child{i}")[:2] == first_blocks for i in (1, 2))
    assert scheduler.get_stats().prefix_cache_hits == 16


class _NoFastPath(dict):
    """A slot-limit table that sends every running request through allocate_slots and cache_blocks every step."""

    def __getitem__(self, request_id: str) -> int:
        return -1


@pytest.mark.parametrize("enable_prefix_caching", [True, False])
def test_the_decode_fast_path_makes_the_same_decisions_as_the_full_slot_check(enable_prefix_caching: bool) -> None:
    schedulers = [make_scheduler(max_num_seqs=6, max_num_batched_tokens=24, num_blocks=14,
                                 enable_prefix_caching=enable_prefix_caching) for _ in range(2)]  # fmt: skip
    manager = schedulers[1].kv_cache_manager
    manager.req_to_slot_limit = _NoFastPath()
    for scheduler in schedulers:  # a shared prefix (hits), and more KV than the pool holds (preemption, resume)
        for i in range(6):
            scheduler.add_request(make_request(f"r{i}", 9 + i, max_tokens=14, start=10 if i % 2 else 100 + i))
    num_preempted = 0
    while schedulers[0].has_unfinished_requests():
        fast, slow = (run_step(scheduler, token=7) for scheduler in schedulers)
        (fast_output, fast_core), (slow_output, slow_core) = fast, slow
        assert [(s.request.request_id, s.num_scheduled_tokens, s.block_ids, s.sample) for s in fast_output.scheduled] \
            == [(s.request.request_id, s.num_scheduled_tokens, s.block_ids, s.sample) for s in slow_output.scheduled]
        assert fast_output.preempted_request_ids == slow_output.preempted_request_ids
        assert [(o.request_id, o.new_token_ids, o.finish_reason) for o in fast_core] == \
            [(o.request_id, o.new_token_ids, o.finish_reason) for o in slow_core]  # fmt: skip
        num_preempted += len(fast_output.preempted_request_ids)
        pools = [scheduler.kv_cache_manager.block_pool for scheduler in schedulers]
        assert pools[0].cached_block_hash_to_block.keys() == pools[1].cached_block_hash_to_block.keys()
    assert not schedulers[1].has_unfinished_requests() and num_preempted > 0
    assert schedulers[0].kv_cache_manager.prefix_cache_hits == manager.prefix_cache_hits
