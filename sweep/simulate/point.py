"""`bench simulate`: a sweep whose every point runs the engine's real scheduler in virtual time, no model.

Per point, a fresh `EngineCore` gets a `SimulatedExecutor` (engine/executor/simulated.py): the real Scheduler,
KV manager and block pool decide every step, and each step advances a virtual clock by the profile's cost model.
Requests reach the engine as the load generator would send them: the same workload lengths (`workloads.load`,
fitted to max_model_len as `bench sweep` does), the same send schedule (`sweep.point.runner.schedule`: closed loop with
a concurrency cap, or gamma/Poisson arrivals at a rate), each request's max_tokens its output length with
ignore_eos. A request joins the engine at the first step boundary after it is sent, as a server polls its queue
between steps; one sent exactly at a boundary (a closed-loop client refilling a slot when a request finishes)
joins at the next one unless the engine is idle, since a real client's round trip is longer than zero and the
engine has started its next step by then. With the profile's hand-over terms (sweep/simulate/api_process.py) a request
instead reaches the engine when the API process hands it over, serially after the requests sent before it: it
joins the first step boundary at or after that, and an idle engine starts its step at the first hand-over with
only the requests handed over by then. Its tokens are "streamed" at the end of the step that produced them.

Prompts are token ids made from the workload specs, not synthesized text: each request's ids are its own except a
shared system prompt (`prefix_group`, `prefix_len`) or Mooncake hash ids (`prefix_ids`), which map to the same ids
in every request that shares them, so prefix-cache hits happen where the workload has them.

The run directory is `bench sweep`'s (sweep/run/results.py): config, points, per-request rows (virtual seconds), with
`config.simulated = true`, `target.backend = "simulated"` and `simulated: true` on every point, so `bench report`
and `bench gate` read it unchanged. Each point also records `simulation`: steps, simulated busy time, the
scheduler's own CPU time per step (schedule + update_from_output, measured around the real calls) and the
simulation's wall time.
"""

from __future__ import annotations

import hashlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.engine_core import EngineCore
from engine.executor.simulated import SimulatedExecutor, VirtualClock
from engine.request import Request
from engine.sampling_params import SamplingParams
from sweep.point.records import RequestRecord
from sweep.simulate.api_process import ApiProcess

TOKEN_ID_RANGE = (1000, 30000)  # ids prompts are drawn from: clear of special tokens, inside any real vocabulary


def _ids(key: str, count: int) -> list[int]:
    seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")
    return np.random.default_rng(seed).integers(*TOKEN_ID_RANGE, size=count).tolist()


def prompt_token_ids(spec: Any, index: int, salt: str) -> list[int]:
    """`spec.input_len` ids: the spec's shared prefix (same ids wherever it is shared), then ids of its own."""
    shared: list[int] = []
    if spec.prefix_ids:
        size = spec.prefix_block_size or 16
        for hash_id in spec.prefix_ids:
            shared += _ids(f"{salt}/hash/{hash_id}", size)
    elif spec.prefix_group is not None and spec.prefix_len:
        shared = _ids(f"{salt}/group/{spec.prefix_group}", spec.prefix_len)
    shared = shared[: spec.input_len]
    return shared + _ids(f"{salt}/request/{index}", spec.input_len - len(shared))


@dataclass
class SimulatedRequest:
    index: int
    prompt_token_ids: list[int]
    output_len: int
    request_class: str | None = None  # the workload's class (per-class SLOs)


class SchedulerTimer:
    """Wraps a scheduler's schedule() and update_from_output() to time them (CPU seconds, per step) and to note
    the virtual time each request is first scheduled."""

    def __init__(self, core: EngineCore, clock: VirtualClock) -> None:
        self.cpu_s: list[float] = []  # per step: schedule + update_from_output
        self.running: list[int] = []  # per step: requests running after schedule()
        self.first_scheduled: dict[str, float] = {}
        scheduler = core.scheduler
        schedule, update = scheduler.schedule, scheduler.update_from_output

        def timed_schedule() -> Any:
            start = time.process_time()
            output = schedule()
            self.cpu_s.append(time.process_time() - start)
            self.running.append(len(scheduler.running))
            for scheduled in output.scheduled:
                self.first_scheduled.setdefault(scheduled.request.request_id, clock.now)
            return output

        def timed_update(*args: Any, **kwargs: Any) -> Any:
            start = time.process_time()
            outputs = update(*args, **kwargs)
            self.cpu_s[-1] += time.process_time() - start
            return outputs

        scheduler.schedule = timed_schedule  # type: ignore[method-assign]
        scheduler.update_from_output = timed_update  # type: ignore[method-assign]


@dataclass
class SimulatedPoint:
    records: list[RequestRecord]
    duration: float
    stats: dict[str, Any]


def simulate_point(
    core: EngineCore,
    executor: SimulatedExecutor,
    requests: Sequence[SimulatedRequest],
    offsets: Sequence[float],
    concurrency: int | None,
    duration: float | None = None,
    on_done: Callable[[], None] | None = None,
    hand_over: tuple[float, float] | None = None,
) -> SimulatedPoint:
    """Send `requests[i]` at virtual time `offsets[i]` (later while `concurrency` are in flight; not at all at or
    after `duration`), run the engine step by step until every sent request finishes. `hand_over`: the API
    process's (seconds per request, seconds per prompt token) before a sent request reaches the engine."""
    clock = executor.clock
    timer = SchedulerTimer(core, clock)
    wall_start, cpu_start = time.perf_counter(), time.process_time()
    records: dict[str, RequestRecord] = {}
    order = deque(sorted(range(len(requests)), key=lambda i: offsets[i]))
    in_flight = freed = 0
    sent_at_boundary: list[tuple[SimulatedRequest, RequestRecord]] = []
    api = ApiProcess(*hand_over) if hand_over is not None else None
    arrivals: dict[str, float] = {}  # engine arrival (hand-over) times, when they differ from the send

    def admit(before_now: bool, idle: bool = False) -> None:
        """Send due requests while the cap allows: those due before this step boundary count against the
        requests in flight before its finishes (and go at their own time), the rest go now and reach the engine
        now only if it was `idle` (else after its next step)."""
        nonlocal in_flight
        while order and (concurrency is None or in_flight < concurrency):
            i = order[0]
            if offsets[i] > clock.now or (before_now and offsets[i] == clock.now):
                return
            send = offsets[i] if before_now else clock.now
            if duration is not None and send >= duration:
                order.clear()
                return
            order.popleft()
            request = requests[i]
            record = RequestRecord(
                index=request.index,
                requested_input_len=len(request.prompt_token_ids),
                requested_output_len=request.output_len,
                intended_send_time=offsets[i],
                send_time=send,
                prompt_tokens=len(request.prompt_token_ids),
                client_prompt_tokens=len(request.prompt_token_ids),
                request_class=request.request_class,
            )
            in_flight += 1
            if api is not None:
                api.send(send, record.prompt_tokens or 0, request, record)
            elif before_now or idle:
                enter(request, record)
            else:
                sent_at_boundary.append((request, record))

    def enter(request: SimulatedRequest, record: RequestRecord) -> None:
        nonlocal in_flight
        try:
            _add(core, request)
        except ValueError as e:  # the server answers 400: a failed request
            record.error, record.end_time = str(e), record.send_time
            records[f"rejected-{request.index}"] = record
            in_flight -= 1
            if on_done is not None:
                on_done()
            return
        records[str(request.index)] = record

    while True:
        for request, record in sent_at_boundary:
            enter(request, record)
        sent_at_boundary.clear()
        admit(before_now=True)
        in_flight -= freed
        freed = 0
        admit(before_now=False, idle=not core.has_unfinished_requests())
        if api is not None:
            for handed, request, record in api.handed_over(clock.now):
                arrivals[str(request.index)] = handed
                enter(request, record)
        if not core.has_unfinished_requests():
            upcoming: list[float] = []
            if api is not None and (hand_over_time := api.next_hand_over()) is not None:
                upcoming.append(hand_over_time)
            if order and (api is None or concurrency is None or in_flight < concurrency):
                upcoming.append(offsets[order[0]])
            if not upcoming:
                break
            clock.now = max(clock.now, min(upcoming))
            continue
        for output in core.step():
            record = records[output.request_id]
            record.chunk_times.append(clock.now)
            record.chunk_tokens.append(len(output.new_token_ids))
            if record.first_token_time is None:
                record.first_token_time = clock.now
            if output.finish_reason is not None:
                record.success = True
                record.last_token_time = record.end_time = clock.now
                record.output_tokens = record.client_output_tokens = sum(record.chunk_tokens)
                record.server_timing = {
                    "arrival_time": arrivals.get(output.request_id, record.send_time),
                    "first_scheduled_time": timer.first_scheduled.get(output.request_id),
                    "first_token_time": record.first_token_time,
                    "num_preemptions": output.timing.num_preemptions if output.timing else None,
                    "num_cached_tokens": output.timing.num_cached_tokens if output.timing else None,
                }
                freed += 1
                if on_done is not None:
                    on_done()
    done = sorted(records.values(), key=lambda r: r.index)
    start = min((r.send_time for r in done), default=0.0)
    end = max((r.end_time or r.send_time for r in done), default=start)
    stats = core.get_stats()
    cpu_us = np.asarray(timer.cpu_s) * 1e6
    return SimulatedPoint(
        records=done,
        duration=end - start,
        stats={
            "steps": executor.num_steps,
            "busy_s": executor.busy_time,
            "num_preemptions": stats.num_preemptions,
            "prefix_cache_hit_rate": stats.prefix_cache_hits / stats.prefix_cache_queries
            if stats.prefix_cache_queries
            else None,
            "mean_running_seqs": float(np.mean(timer.running)) if timer.running else 0.0,
            "max_running_seqs": max(timer.running, default=0),
            "scheduler_cpu_us_per_step_mean": float(cpu_us.mean()) if cpu_us.size else 0.0,
            "scheduler_cpu_us_per_step_p50": float(np.median(cpu_us)) if cpu_us.size else 0.0,
            "scheduler_cpu_us_per_step_p99": float(np.percentile(cpu_us, 99)) if cpu_us.size else 0.0,
            "wall_s": time.perf_counter() - wall_start,
            "cpu_s": time.process_time() - cpu_start,
        },
    )


def _add(core: EngineCore, request: SimulatedRequest) -> None:
    num_prompt, max_model_len = len(request.prompt_token_ids), core.max_model_len
    if num_prompt + request.output_len > max_model_len:  # as the OpenAI server (and vLLM's) rejects it
        raise ValueError(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{num_prompt + request.output_len} tokens ({num_prompt} in the prompt, {request.output_len} in the "
            "completion). Please reduce the length of the prompt or the max_tokens."
        )
    params = SamplingParams(temperature=0.0, max_tokens=request.output_len, ignore_eos=True)
    core.add_request(
        Request(
            str(request.index),
            request.prompt_token_ids,
            params,
            eos_token_id=core.eos_token_ids[0],
            max_tokens=request.output_len,
        )
    )
