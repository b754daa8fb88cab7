"""The contract between the scheduler and the model runner for one engine step.

A scheduled request runs `num_scheduled_tokens` tokens: its known tokens
all_token_ids[num_computed_tokens : num_computed_tokens + num_scheduled_tokens - len(spec_token_ids)], then its
draft tokens, at consecutive positions; their KV goes to the slots of `block_ids`. When `sample` is set (the known
tokens reach the end of the request's tokens) the runner returns 1 + len(spec_token_ids) logits rows for it: the
last known token's row, then one row per draft. Row j scores the token that follows draft j-1, so the target's
choice there accepts or rejects draft j.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.request import Request


@dataclass(slots=True)  # one per running request per step
class ScheduledRequest:
    request: Request
    num_scheduled_tokens: int  # known tokens + drafts
    block_ids: list[int]  # the KV manager's list, shared and never changed by it: do not mutate
    sample: bool  # decided by the scheduler: a partial prefill chunk samples nothing
    spec_token_ids: list[int] = field(default_factory=list)

    @property
    def num_logits_rows(self) -> int:
        return 1 + len(self.spec_token_ids) if self.sample else 0

    @property
    def num_prompt_logprobs_rows(self) -> int:
        """Rows before the sampling rows for prompt logprobs: one per prompt position computed this step, except
        the prompt's last (its row is the sampling row). 0 unless the request asks for prompt_logprobs."""
        request = self.request
        if request.sampling_params.prompt_logprobs is None:
            return 0
        first = request.num_computed_tokens
        last = min(first + self.num_scheduled_tokens - len(self.spec_token_ids), request.num_prompt_tokens - 1)
        return max(last - first, 0)


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
        """The requests that sample this step, in batch order (the scheduler's `sample` flag)."""
        return [s for s in self.scheduled if s.sample]
