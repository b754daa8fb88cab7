"""The contract between the scheduler and the model runner for one engine step."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.request import Request


@dataclass
class ScheduledRequest:
    request: Request
    # Tokens all_token_ids[num_computed_tokens : num_computed_tokens + num_scheduled_tokens]
    # run this step, at those positions; their KV goes to the slots given by block_ids.
    num_scheduled_tokens: int
    block_ids: list[int]


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)  # batch order
    total_num_scheduled_tokens: int = 0
    preempted_request_ids: list[str] = field(default_factory=list)
    finished_request_ids: list[str] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    def sampling_requests(self) -> list[ScheduledRequest]:
        """Requests whose scheduled tokens reach the end of their known tokens: they sample one token.

        A partial prefill chunk samples nothing.
        """
        return [
            s
            for s in self.scheduled
            if s.request.num_computed_tokens + s.num_scheduled_tokens >= s.request.num_tokens
        ]
