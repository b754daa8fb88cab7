"""SimulatedExecutor: the real scheduler makes the same decisions behind it as behind the model runner."""

from __future__ import annotations

import pytest

from engine.config import EngineConfig
from engine.engine_core import EngineCore
from engine.executor.cost_model import CostModel
from engine.executor.simulated import SimulatedExecutor
from engine.request import Request
from engine.sampling_params import SamplingParams
from engine.scheduler_output import SchedulerOutput

SHARED = [11, 12, 13, 14, 15, 16, 17, 18]  # two full blocks of 4
# (step the request arrives before, prompt): r2 repeats r0's prompt, r1 shares its first two blocks.
STREAM = [
    (0, SHARED + [20, 21, 22]),
    (0, SHARED + [30, 31]),
    (2, SHARED + [20, 21, 22]),
    (3, [40 + i for i in range(9)]),
    (3, [60 + i for i in range(6)]),
    (6, SHARED + [20, 21, 22, 23, 24]),
]
MAX_TOKENS = 8
KNOBS = dict(
    model="tiny-random", dtype="float32", block_size=4, max_model_len=64, num_gpu_blocks_override=10,
    max_num_seqs=4, max_num_batched_tokens=16,
)  # fmt: skip


def run(core: EngineCore) -> tuple[list[list[tuple[str, int, bool]]], list[list[str]], dict[str, int]]:
    """Feed STREAM by step index; returns each step's plan, its preemptions, and each request's prefix hits."""
    plans: list[list[tuple[str, int, bool]]] = []
    preempted: list[list[str]] = []
    schedule = core.scheduler.schedule

    def recording_schedule() -> SchedulerOutput:
        output = schedule()
        plans.append([(s.request.request_id, s.num_scheduled_tokens, s.sample) for s in output.scheduled])
        preempted.append(list(output.preempted_request_ids))
        return output

    core.scheduler.schedule = recording_schedule  # type: ignore[method-assign]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    requests = [Request(f"r{i}", list(p), params, eos_token_id=0, max_tokens=MAX_TOKENS) for i, (_, p) in
                enumerate(STREAM)]  # fmt: skip
    step = 0
    while step <= max(s for s, _ in STREAM) or core.has_unfinished_requests():
        for (arrival, _), request in zip(STREAM, requests, strict=True):
            if arrival == step:
                core.add_request(request)
        core.step()
        step += 1
    return plans, preempted, {r.request_id: r.timing.num_cached_tokens for r in requests}


def test_simulated_executor_drives_the_same_schedule_as_the_model_runner() -> None:
    config = EngineConfig.from_kwargs(**KNOBS)
    real = run(EngineCore(config))
    executor = SimulatedExecutor(CostModel({"overhead": 0.01}), num_blocks=10, max_model_len=64)
    simulated = run(EngineCore(EngineConfig.from_kwargs(**KNOBS), executor=executor))
    plans, preempted, hits = real
    assert any(preempted), "the stream must exercise preemption"
    assert hits["r2"] == 8 and hits["r1"] == 8 and hits["r3"] == 0, "and prefix hits"
    assert simulated == real
    assert executor.num_steps == len(plans) and executor.clock.now == pytest.approx(0.01 * len(plans))


def test_simulated_executor_rejects_a_bad_setup() -> None:
    with pytest.raises(ValueError, match="at least one block"):
        SimulatedExecutor(CostModel({}), num_blocks=0, max_model_len=64)
    with pytest.raises(ValueError, match="token_id"):
        SimulatedExecutor(CostModel({}), num_blocks=4, max_model_len=64, token_id=0)
