"""What the engine hands back: per-step core outputs and vLLM-shaped request outputs."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.request import RequestTiming


@dataclass
class Logprob:
    token_id: int
    logprob: float
    rank: int  # 1 = most likely


@dataclass(slots=True)  # one per running request per step
class EngineCoreOutput:
    """One request's progress in one engine step: token ids only, no text."""

    request_id: str
    new_token_ids: list[int]
    # Per new token: the sampled token's logprob followed by the top-N, when logprobs were asked for.
    new_logprobs: list[list[Logprob]] | None = None
    num_prompt_tokens: int = 0  # fourth, so the scheduler builds each step's outputs positionally (cheaper)
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    timing: RequestTiming | None = None  # set when the request finishes
    # With prompt_logprobs: on the request's first output, per prompt token (None first) token id -> Logprob.
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: list[list[Logprob]] | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    timing: RequestTiming | None = None
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None  # with SamplingParams.prompt_logprobs


@dataclass
class SpecDecodingStats:
    """Cumulative speculative-decoding counters (vLLM's `vllm:spec_decode_*` meanings).

    num_drafts: request-steps that verified at least one draft token; num_draft_tokens: draft tokens verified;
    num_accepted_tokens: of those, the ones the target accepted; num_accepted_tokens_per_pos[i]: accepted draft
    tokens at draft position i (0-based), one slot per num_speculative_tokens.
    """

    num_spec_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.num_accepted_tokens_per_pos:
            self.num_accepted_tokens_per_pos = [0] * self.num_spec_tokens

    def observe(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """Count one request-step that verified `num_draft_tokens` drafts and accepted the first
        `num_accepted_tokens`."""
        if num_draft_tokens == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        for position in range(num_accepted_tokens):
            self.num_accepted_tokens_per_pos[position] += 1


@dataclass
class SchedulerStats:
    """Gauges and counters behind /metrics (vLLM's names)."""

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0  # fraction of KV blocks in use, 0..1
    prefix_cache_queries: int = 0  # prompt tokens looked up (cumulative)
    prefix_cache_hits: int = 0  # prompt tokens found (cumulative)
    num_preemptions: int = 0  # cumulative
    num_prompt_tokens: int = 0  # cumulative prompt tokens computed
    num_generation_tokens: int = 0  # cumulative generated tokens
    spec_decoding_stats: SpecDecodingStats | None = None  # None when speculative decoding is off
