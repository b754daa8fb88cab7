"""The contract between the scheduler and the model runner for one engine step.

A scheduled request runs `num_scheduled_tokens` tokens: its known tokens
all_token_ids[num_computed_tokens : num_computed_tokens + num_scheduled_tokens - len(spec_token_ids)], then its
draft tokens, at consecutive positions; their KV goes to the slots of `block_ids`. When `sample` is set (the known
tokens reach the end of the request's tokens) the runner returns 1 + len(spec_token_ids) logits rows for it: the
last known token's row, then one row per draft. Row j scores the token that follows draft j-1, so the target's
choice there accepts or rejects draft j.

A request asking for prompt logprobs also gets `num_prompt_logprobs_rows` rows before its sampling rows. The step's
row layout (`LogitsRows`) is computed once, on the first read of `SchedulerOutput.logits_rows` (before the step's
update, which advances the `num_computed_tokens` it reads), and every consumer reads its offsets from there.
"""

from __future__ import annotations

from collections.abc import Sequence
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


@dataclass(frozen=True, slots=True)
class LogitsRows:
    """The logits rows of one step, in the runner's output order: per scheduled request (batch order) its
    prompt-logprob rows, then its 1 + len(spec_token_ids) sampling rows (none for a request that does not sample).

    The sampling rows alone (the prompt-logprob rows taken out) are what the sampler, the rejection sampler and the
    grammar bitmask index: `sample_starts[i]` is the first of them for the i-th sampling request."""

    num_prompt_logprobs_rows: tuple[int, ...]  # per scheduled request
    num_sample_rows: tuple[int, ...]  # per scheduled request: 1 + drafts when it samples, else 0
    prompt_logprobs_starts: tuple[int, ...]  # per scheduled request: its first row in the runner's output
    sample_starts: tuple[int, ...]  # per sampling request: its first row among the sampling rows
    num_rows: int  # the runner's output rows: prompt-logprob rows and sampling rows
    num_sampling_rows: int  # the sampling rows alone

    @classmethod
    def of(cls, scheduled: Sequence[ScheduledRequest]) -> LogitsRows:
        # One pass, inlining num_logits_rows (and num_prompt_logprobs_rows only where asked for): this runs every
        # step for every scheduled request, so it is the scheduler's hot path (engine/benchmarks/scheduler_cost.py).
        prompt: list[int] = []
        sample: list[int] = []
        prompt_starts: list[int] = []
        sample_starts: list[int] = []
        num_rows = num_sampling_rows = 0
        for s in scheduled:
            num_prompt = 0 if s.request.sampling_params.prompt_logprobs is None else s.num_prompt_logprobs_rows
            num_sample = 1 + len(s.spec_token_ids) if s.sample else 0
            prompt.append(num_prompt)
            sample.append(num_sample)
            prompt_starts.append(num_rows)
            num_rows += num_prompt + num_sample
            if num_sample:
                sample_starts.append(num_sampling_rows)
                num_sampling_rows += num_sample
        return cls(tuple(prompt), tuple(sample), tuple(prompt_starts), tuple(sample_starts), num_rows,
                   num_sampling_rows)

    @property
    def has_prompt_logprobs(self) -> bool:
        return self.num_rows != self.num_sampling_rows

    def sample_rows(self, index: int) -> slice:
        """The sampling rows of the `index`-th sampling request, among the sampling rows."""
        start = self.sample_starts[index]
        end = self.sample_starts[index + 1] if index + 1 < len(self.sample_starts) else self.num_sampling_rows
        return slice(start, end)

    def output_sample_rows(self) -> list[int]:
        """The sampling rows' positions in the runner's output (every row that is not a prompt-logprob row)."""
        rows: list[int] = []
        for start, num_prompt, num_sample in zip(
            self.prompt_logprobs_starts, self.num_prompt_logprobs_rows, self.num_sample_rows, strict=True
        ):
            rows += range(start + num_prompt, start + num_prompt + num_sample)
        return rows


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)  # batch order
    total_num_scheduled_tokens: int = 0
    preempted_request_ids: list[str] = field(default_factory=list)
    finished_request_ids: list[str] = field(default_factory=list)
    _logits_rows: LogitsRows | None = field(default=None, init=False, repr=False)

    @property
    def logits_rows(self) -> LogitsRows:
        """The step's row layout, computed on first read and kept. Invariant: the first read comes before the step's
        update advances `num_computed_tokens` (EngineCore.step reads it before executing the model), so schedule()
        itself pays nothing for it, as before the layout had one home."""
        if self._logits_rows is None:
            self._logits_rows = LogitsRows.of(self.scheduled)
        return self._logits_rows

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    def sampling_requests(self) -> list[ScheduledRequest]:
        """The requests that sample this step, in batch order (the scheduler's `sample` flag)."""
        return [s for s in self.scheduled if s.sample]
