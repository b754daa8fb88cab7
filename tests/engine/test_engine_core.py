"""EngineCore's step with drafts: greedy output is unchanged by any drafts, right ones save steps."""

from __future__ import annotations

import time

import pytest
import torch

from engine.config import EngineConfig
from engine.engine_core import EngineCore, accept_drafts, spin
from engine.request import Request
from engine.sampling_params import SamplingParams
from engine.scheduler_output import SchedulerOutput
from engine.spec_decode import NoSpeculation

PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [40, 41, 42], list(range(100, 121)), [7, 7, 7, 7, 7]]
MAX_TOKENS = 20


@pytest.mark.parametrize(
    ("drafts", "row_tokens", "expected"),
    [
        ([], [5], [5]),
        ([5, 6, 7], [5, 6, 7, 8], [5, 6, 7, 8]),  # all accepted + the bonus token
        ([5, 6, 7], [5, 9, 7, 8], [5, 9]),  # the first disagreement ends the step with the target's token
        ([5, 6], [4, 6, 1], [4]),
    ],
)
def test_accept_drafts(drafts: list[int], row_tokens: list[int], expected: list[int]) -> None:
    assert accept_drafts(drafts, row_tokens) == expected


@pytest.fixture(scope="module")
def core() -> EngineCore:
    return EngineCore(EngineConfig.from_kwargs(model="tiny-random", dtype="float32", block_size=4, max_model_len=256))


def test_speculation_off_is_a_decoder_that_does_nothing(core: EngineCore) -> None:
    assert isinstance(core.spec_decoder, NoSpeculation)
    assert core.spec_decoder.draft_block_bytes == 0
    assert core.get_stats().spec_decoding_stats is None


def run(core: EngineCore, propose: dict[int, list[int]] | None = None, logprobs: int | None = None) -> tuple:
    """Greedy generation of PROMPTS; `propose[i]` (the reference output) feeds request i drafts each step."""
    requests = []
    for i, prompt in enumerate(PROMPTS):
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=logprobs)
        requests.append(Request(f"r{i}", list(prompt), params, eos_token_id=2, max_tokens=MAX_TOKENS))
        core.add_request(requests[-1])
    outputs: dict[str, list[int]] = {r.request_id: [] for r in requests}
    logprob_counts: dict[str, int] = dict.fromkeys(outputs, 0)
    steps: dict[str, int] = dict.fromkeys(outputs, 0)  # steps that gave each request tokens
    while core.has_unfinished_requests():
        for i, request in enumerate(requests):
            if propose is not None and not request.is_finished and request.num_output_tokens:
                done = request.num_output_tokens
                reference = propose[i][done : done + 4]
                # Request 1 gets wrong drafts after two right ones; request 3 gets only wrong ones.
                request.spec_token_ids = (
                    [t + 1 for t in reference] if i == 3 else reference[:2] + [t + 1 for t in reference[2:]]
                    if i == 1 else reference
                )
        for output in core.step():
            outputs[output.request_id] += output.new_token_ids
            steps[output.request_id] += 1
            if output.new_logprobs is not None:
                assert len(output.new_logprobs) == len(output.new_token_ids)
                logprob_counts[output.request_id] += len(output.new_logprobs)
    assert core.get_stats().kv_cache_usage == 0.0
    return [outputs[r.request_id] for r in requests], list(steps.values()), logprob_counts


def test_greedy_output_is_unchanged_by_right_and_wrong_drafts(core: EngineCore) -> None:
    reference, reference_steps, _ = run(core)
    assert all(len(tokens) == MAX_TOKENS for tokens in reference)
    with_drafts, steps, logprob_counts = run(core, propose=dict(enumerate(reference)), logprobs=2)
    assert with_drafts == reference
    assert reference_steps == [MAX_TOKENS] * 4
    assert steps[0] == steps[2] == 1 + 4  # the prefill, then 4 accepted drafts + the bonus token per step
    assert steps[1] == 1 + 7  # 2 of 4 drafts accepted + 1 per step: 3 tokens a step
    assert steps[3] == MAX_TOKENS  # no draft ever accepted
    assert all(count == MAX_TOKENS for count in logprob_counts.values())


class FixedTokenExecutor:
    """An executor whose every logits row puts all its mass on one token, with a fixed-size KV pool."""

    def __init__(self, token: int, num_blocks: int) -> None:
        self.max_model_len, self.eos_token_ids, self.vocab_size = 64, [0], 32
        self.device, self.forward_mode = torch.device("cpu"), "eager (fake executor)"
        self.token, self.num_blocks, self.steps = token, num_blocks, 0

    def determine_num_blocks(self, extra_block_bytes: int = 0) -> int:
        return self.num_blocks

    def initialize_kv_cache(self, num_blocks: int) -> None:
        assert num_blocks == self.num_blocks

    def execute_model(self, scheduler_output: SchedulerOutput) -> torch.Tensor:
        self.steps += 1
        rows = sum(s.num_logits_rows for s in scheduler_output.scheduled if s.sample)
        logits = torch.zeros(rows, self.vocab_size)
        logits[:, self.token] = 10.0
        return logits


def test_engine_core_runs_any_executor() -> None:
    config = EngineConfig.from_kwargs(model="tiny-random", block_size=4, max_model_len=64)
    executor = FixedTokenExecutor(token=7, num_blocks=16)
    core = EngineCore(config, executor=executor)
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    core.add_request(Request("a", [1, 2, 3], params, eos_token_id=0, max_tokens=5))
    tokens: list[int] = []
    while core.has_unfinished_requests():
        for output in core.step():
            tokens += output.new_token_ids
    assert tokens == [7] * 5
    assert executor.steps == 5


def test_spin_waits_at_least_the_time_asked() -> None:
    start = time.perf_counter()
    spin(0.002)
    assert time.perf_counter() - start >= 0.002


def test_inject_step_delay_spins_once_per_model_step(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr("engine.engine_core.spin", sleeps.append)
    config = EngineConfig.from_kwargs(model="tiny-random", block_size=4, max_model_len=64, inject_step_delay_ms=20)
    executor = FixedTokenExecutor(token=7, num_blocks=16)
    core = EngineCore(config, executor=executor)
    core.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=3, ignore_eos=True), 0, max_tokens=3))
    while core.has_unfinished_requests():
        core.step()
    assert sleeps == [0.02] * executor.steps and executor.steps == 3
