"""Prompt logprobs (vLLM's `SamplingParams.prompt_logprobs`): the logprob of every prompt token given the ones
before it, with the top-N alternatives, computed from the prefill steps' logits.

A request asking for them gets one extra logits row per prompt position it computes, except the last (whose row
is the sampling row), placed before its sampling rows (`SchedulerOutput.logits_rows`). They are
computed from the raw logits (no penalties or masks), as vLLM does. Entry i of the result is a dict
token id -> Logprob for prompt token i (the prompt token first, then the top-N); entry 0 is None. The whole list
travels on the request's first output.
"""

from __future__ import annotations

import torch

from engine.outputs import EngineCoreOutput, Logprob
from engine.scheduler_output import SchedulerOutput

PromptLogprobs = list[dict[int, Logprob] | None]


def prompt_logprob_entries(logits: torch.Tensor, next_token_ids: list[int], num: int) -> list[dict[int, Logprob]]:
    """For each row, {next token: its Logprob, then the top-`num` tokens} from log_softmax(row)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    targets = torch.tensor(next_token_ids, dtype=torch.long, device=logits.device).unsqueeze(1)
    target_logprobs = logprobs.gather(1, targets)
    ranks = (logprobs > target_logprobs).sum(dim=-1) + 1
    top_values, top_ids = logprobs.topk(num, dim=-1) if num > 0 else (logprobs[:, :0], targets[:, :0])
    entries = []
    for row, token_id in enumerate(next_token_ids):
        entry = {token_id: Logprob(token_id, float(target_logprobs[row, 0]), int(ranks[row]))}
        for rank, (value, top_id) in enumerate(zip(top_values[row].tolist(), top_ids[row].tolist(), strict=True)):
            entry.setdefault(top_id, Logprob(top_id, value, rank + 1))
        entries.append(entry)
    return entries


def take_prompt_logprobs(scheduler_output: SchedulerOutput, logits: torch.Tensor) -> torch.Tensor:
    """Record the prompt-logprob rows of this step on their requests; returns the sampling rows only."""
    layout = scheduler_output.logits_rows
    if not layout.has_prompt_logprobs:
        return logits
    for scheduled, start, num_rows in zip(
        scheduler_output.scheduled, layout.prompt_logprobs_starts, layout.num_prompt_logprobs_rows, strict=True
    ):
        if num_rows:
            request = scheduled.request
            first = request.num_computed_tokens  # the position of the first known token this step
            targets = request.prompt_token_ids[first + 1 : first + 1 + num_rows]
            num = request.sampling_params.prompt_logprobs
            assert num is not None
            if not request.prompt_logprobs:
                request.prompt_logprobs = [None] * request.num_prompt_tokens
            entries = prompt_logprob_entries(logits[start : start + num_rows], targets, num)
            request.prompt_logprobs[first + 1 : first + 1 + num_rows] = entries
    return logits[torch.tensor(layout.output_sample_rows(), dtype=torch.long, device=logits.device)]


def attach_prompt_logprobs(scheduler_output: SchedulerOutput, outputs: list[EngineCoreOutput]) -> None:
    """Put the finished prompt logprobs on each asking request's first output (its first sampled token)."""
    by_id = {s.request.request_id: s.request for s in scheduler_output.scheduled}
    for output in outputs:
        request = by_id.get(output.request_id)
        if request is None or request.sampling_params.prompt_logprobs is None:
            continue
        if len(request.output_token_ids) == len(output.new_token_ids):  # this step sampled its first tokens
            output.prompt_logprobs = request.prompt_logprobs or [None] * request.num_prompt_tokens
