"""What the engine hands back: per-step core outputs and vLLM-shaped request outputs."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.request import RequestTiming


@dataclass
class Logprob:
    token_id: int
    logprob: float
    rank: int  # 1 = most likely


@dataclass
class EngineCoreOutput:
    """One request's progress in one engine step: token ids only, no text."""

    request_id: str
    new_token_ids: list[int]
    # Per new token: the sampled token's logprob followed by the top-N, when logprobs were asked for.
    new_logprobs: list[list[Logprob]] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    timing: RequestTiming | None = None  # set when the request finishes
    num_prompt_tokens: int = 0
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
