"""Scheduler: token budget and sequence cap, chunked prefill, preemption order, finish rules, rejection."""

from __future__ import annotations

import pytest

from engine.config import CacheConfig, SchedulerConfig
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
    return Scheduler(
        SchedulerConfig(max_num_seqs, max_num_batched_tokens, enable_chunked_prefill),
        CacheConfig(block_size=4, enable_prefix_caching=enable_prefix_caching),
        max_model_len,
        num_blocks,
    )


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
