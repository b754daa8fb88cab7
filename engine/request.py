"""A request's life inside the engine: its tokens, progress, KV blocks and timing."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from engine.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = enum.auto()
    WAITING_FOR_FSM = enum.auto()  # queued, its structured-output grammar still compiling
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH = enum.auto()
    FINISHED_ABORTED = enum.auto()

    @property
    def is_finished(self) -> bool:
        return self in FINISHED_STATUSES

    @property
    def finish_reason(self) -> str | None:
        return {
            RequestStatus.FINISHED_STOPPED: "stop",
            RequestStatus.FINISHED_LENGTH: "length",
            RequestStatus.FINISHED_ABORTED: "abort",
        }.get(self)


# A tuple, not a set: membership is an identity check per member, where a set would hash through Enum.__hash__
# (Python code); the scheduler tests it for every request every step.
FINISHED_STATUSES = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORTED)


@dataclass
class RequestTiming:
    """Engine-clock timestamps (time.monotonic seconds) and counters reported per request."""

    arrival_time: float = field(default_factory=time.monotonic)
    first_scheduled_time: float | None = None  # left the waiting queue
    first_token_time: float | None = None
    finished_time: float | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at first schedule
    # Structured outputs (engine/structured_output/manager.py): the wait for the compiled grammar (0 when cached),
    # and the time spent filling this request's bitmask rows over that many steps.
    grammar_compile_time: float | None = None
    grammar_bitmask_time: float = 0.0
    num_grammar_bitmask_steps: int = 0


@dataclass(eq=False)  # identity: list.remove/index on the scheduler's queues must not compare every field
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None = None
    max_tokens: int = 16  # resolved: sampling_params.max_tokens or what max_model_len leaves
    output_token_ids: list[int] = field(default_factory=list)
    # Tokens whose KV is in the cache; the scheduler advances it, preemption resets it to 0.
    num_computed_tokens: int = 0
    # Draft tokens proposed for the next step (speculative decoding); the scheduler moves them onto the step's
    # ScheduledRequest, so they are never part of all_token_ids until the target accepts them.
    spec_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    stop_reason: int | str | None = None
    timing: RequestTiming = field(default_factory=RequestTiming)
    # With sampling_params.prompt_logprobs: one entry per prompt position, filled as prefill chunks run
    # (engine/prompt_logprobs.py).
    prompt_logprobs: list[Any] = field(default_factory=list)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED_STATUSES
