"""Request processing around the engine core, shared by LLMEngine and the OpenAI server (both in the process that
holds the tokenizer; the engine core sees token ids only).

In: `Processor.build_request` turns a prompt (text or token ids) and SamplingParams into a validated engine
`Request`: max_tokens resolved against max_model_len, the EOS id chosen, the model's other EOS ids added as stop
token ids. A bad request raises `RequestError` naming the offending parameter.

Out: a `ParentRequest` follows one request through the engine. With `n > 1` it fans the request out into n
children (parallel sampling, as vLLM v1's ParentRequest): child i has the id `f"{i}_{request_id}"` and, when a
seed is given, the seed `seed + i`; all share the prompt, so the prefix cache serves children 2..n the prompt
blocks that child 1 computes. Each child's engine outputs go through a `CompletionState` (incremental
detokenizer, stop strings held back, finish reasons, logprobs) that yields a `CompletionDelta` per output.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from engine.detokenizer import IncrementalDetokenizer
from engine.outputs import CompletionOutput, EngineCoreOutput, Logprob, RequestOutput
from engine.request import Request, RequestTiming
from engine.sampling_params import SamplingParams

_SEED_RANGE = (-(2**63), 2**64)  # what torch.Generator.manual_seed accepts


class RequestError(ValueError):
    """A request that can never run; `param` names the input at fault (OpenAI's error `param`)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class Processor:
    """Prompt + SamplingParams → engine Request, for a model with these limits (no engine core needed)."""

    def __init__(self, tokenizer: Any, max_model_len: int, vocab_size: int, eos_token_ids: list[int]) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)

    def check_token_ids(self, token_ids: list[int], param: str) -> None:
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            message = f"token ids must be in [0, {self.vocab_size}), got {bad[:5]} (outside the vocabulary)"
            raise RequestError(message, param)

    def build_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
        max_tokens_param: str | None = None,
    ) -> Request:
        """Tokenize (a text prompt), validate and build the Request.

        `max_tokens_param` is set by the OpenAI server (the name the client used for max_tokens): as vLLM's
        server does, a prompt plus max_tokens beyond max_model_len is then rejected with vLLM's wording. Without
        it (the offline LLM, as vLLM's) such a request runs and stops at max_model_len with finish_reason "length".
        """
        is_text = isinstance(prompt, str)
        prompt_token_ids = list(self.tokenizer.encode(prompt)) if is_text else [int(t) for t in prompt]
        num_prompt, max_model_len = len(prompt_token_ids), self.max_model_len
        if num_prompt == 0:
            raise RequestError("the prompt is empty after tokenisation" if is_text else "the prompt is empty", "prompt")
        self.check_token_ids(prompt_token_ids, "prompt")
        if params.seed is not None and not _SEED_RANGE[0] <= params.seed <= _SEED_RANGE[1] - params.n:
            what = "seed" if params.n == 1 else f"seed + {params.n - 1} (the last of the n={params.n} samples' seeds)"
            raise RequestError(f"{what} must fit in 64 bits, got seed={params.seed}", "seed")
        if params.structured_outputs is not None:
            check_structured_outputs(params)
        overruns = params.max_tokens is not None and num_prompt + params.max_tokens > max_model_len
        if max_tokens_param is not None and overruns:
            raise RequestError(
                f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                f"{num_prompt + params.max_tokens} tokens ({num_prompt} in the prompt, {params.max_tokens} in the "
                f"completion). Please reduce the length of the prompt or the {max_tokens_param}.",
                max_tokens_param,
            )
        if num_prompt >= max_model_len:
            if max_tokens_param is not None:
                message = (
                    f"This model's maximum context length is {max_model_len} tokens. However, your prompt has "
                    f"{num_prompt} tokens, which leaves no room for output. Please reduce the length of the prompt."
                )
            else:
                message = (
                    f"the prompt has {num_prompt} tokens, but max_model_len={max_model_len} leaves no room for an "
                    "output token; shorten the prompt or raise max_model_len"
                )
            raise RequestError(message, "prompt")
        eos_token_id = self.eos_token_ids[0] if self.eos_token_ids else None
        extra_eos = [t for t in self.eos_token_ids if t != eos_token_id and t not in params.stop_token_ids]
        if extra_eos and not params.ignore_eos:
            # As vLLM: the model's other EOS ids (generation_config) act as stop token ids.
            params = replace(params, stop_token_ids=[*params.stop_token_ids, *extra_eos])
        return Request(
            request_id=request_id,
            prompt_token_ids=prompt_token_ids,
            sampling_params=params,
            eos_token_id=eos_token_id,
            max_tokens=params.max_tokens if params.max_tokens is not None else max_model_len - num_prompt,
            timing=RequestTiming(arrival_time if arrival_time is not None else time.monotonic()),
        )


def check_structured_outputs(params: SamplingParams) -> None:
    """RequestError (param "structured_outputs", xgrammar's message) unless the grammar compiler accepts the spec."""
    from engine.structured_output import StructuredOutputsError
    from engine.structured_output.backend_xgrammar import validate_structured_outputs

    assert params.structured_outputs is not None
    try:
        validate_structured_outputs(params.structured_outputs)
    except StructuredOutputsError as error:
        raise RequestError(str(error), "structured_outputs") from error


def child_requests(request: Request) -> list[Request]:
    """The engine requests that sample `request`'s n completions: the request itself when n == 1."""
    params = request.sampling_params
    if params.n == 1:
        return [request]
    children = []
    for index in range(params.n):
        seed = params.seed + index if params.seed is not None else None
        children.append(
            Request(
                request_id=f"{index}_{request.request_id}",
                prompt_token_ids=list(request.prompt_token_ids),
                sampling_params=replace(params, n=1, seed=seed),
                eos_token_id=request.eos_token_id,
                max_tokens=request.max_tokens,
                timing=RequestTiming(request.timing.arrival_time),
            )
        )
    return children


def merge_timings(timings: list[RequestTiming]) -> RequestTiming:
    """One request's timing from its children's: the earliest start of each phase, the last finish (None until all
    finished), preemptions summed, and the prompt's cached tokens as its first child saw them."""

    def earliest(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return min(known) if known else None

    if len(timings) == 1:
        return timings[0]
    finished = [t.finished_time for t in timings]
    return RequestTiming(
        arrival_time=min(t.arrival_time for t in timings),
        first_scheduled_time=earliest([t.first_scheduled_time for t in timings]),
        first_token_time=earliest([t.first_token_time for t in timings]),
        finished_time=None if None in finished else max(finished),  # type: ignore[type-var]
        num_preemptions=sum(t.num_preemptions for t in timings),
        num_cached_tokens=timings[0].num_cached_tokens,
        grammar_compile_time=earliest([t.grammar_compile_time for t in timings]),
        grammar_bitmask_time=sum(t.grammar_bitmask_time for t in timings),
        num_grammar_bitmask_steps=sum(t.num_grammar_bitmask_steps for t in timings),
    )


@dataclass
class CompletionDelta:
    """What one engine output adds to completion `index`, after detokenisation and stop strings."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[list[Logprob]] | None
    finish_reason: str | None
    stop_reason: int | str | None
    # A stop string ended the completion here while the engine still runs it: the caller aborts it there.
    stopped_by_string: bool = False
    # With prompt_logprobs: on the completion's first delta, per prompt token (None first) token id -> Logprob.
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class CompletionState:
    """One engine request's text so far: token ids, logprobs and the incremental detokenizer."""

    def __init__(self, tokenizer: Any, request: Request, index: int) -> None:
        self.request = request
        self.index = index
        self.detokenizer = IncrementalDetokenizer(tokenizer, request.prompt_token_ids, request.sampling_params)
        self.token_ids: list[int] = []
        self.logprobs: list[list[Logprob]] | None = [] if request.sampling_params.logprobs is not None else None
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None

    def update(self, output: EngineCoreOutput) -> CompletionDelta:
        """Take one engine output; tokens after a stop string are dropped."""
        new_token_ids: list[int] = []
        stop_string = None
        for token_id in output.new_token_ids:
            new_token_ids.append(token_id)
            stop_string = self.detokenizer.update([token_id])
            if stop_string is not None:
                break
        self.token_ids += new_token_ids
        new_logprobs = output.new_logprobs[: len(new_token_ids)] if output.new_logprobs is not None else None
        if self.logprobs is not None and new_logprobs is not None:
            self.logprobs += new_logprobs
        self.finish_reason, self.stop_reason = output.finish_reason, output.stop_reason
        stopped_by_string = stop_string is not None and output.finish_reason is None
        if stop_string is not None:
            self.finish_reason, self.stop_reason = "stop", stop_string
        text = self.detokenizer.get_next_output_text(self.finished, delta=True)
        return CompletionDelta(self.index, text, new_token_ids, new_logprobs, self.finish_reason, self.stop_reason,
                               stopped_by_string, output.prompt_logprobs)  # fmt: skip

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def completion_output(self) -> CompletionOutput:
        """The completion so far (a partial stop-string match held back until it resolves)."""
        return CompletionOutput(
            index=self.index,
            text=self.detokenizer.get_next_output_text(self.finished, delta=False),
            token_ids=list(self.token_ids),
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
            logprobs=list(self.logprobs) if self.logprobs is not None else None,
        )


class ParentRequest:
    """A request and the engine requests (`children`) that sample its n completions; see the module docstring."""

    def __init__(self, request: Request, tokenizer: Any, prompt: str | None = None) -> None:
        self.request = request
        self.prompt = prompt  # the prompt text, when it was given as text
        self.children = child_requests(request)
        self.completions = {  # by child request id, in index order
            child.request_id: CompletionState(tokenizer, child, index) for index, child in enumerate(self.children)
        }
        self.num_unfinished = len(self.children)
        self.prompt_logprobs: list[dict[int, Logprob] | None] | None = None  # from the first child's first output

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def finished(self) -> bool:
        return self.num_unfinished == 0

    def update(self, output: EngineCoreOutput) -> CompletionDelta:
        """Route one child's engine output to its completion."""
        delta = self.completions[output.request_id].update(output)
        if output.prompt_logprobs is not None and self.prompt_logprobs is None:
            self.prompt_logprobs = output.prompt_logprobs
        if delta.finished:
            self.num_unfinished -= 1
        return delta

    def request_output(self) -> RequestOutput:
        """Every completion so far, by index; timing once all are finished (the children's, merged)."""
        finished = self.finished
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.request.prompt_token_ids,
            outputs=[state.completion_output() for state in self.completions.values()],
            finished=finished,
            timing=merge_timings([child.timing for child in self.children]) if finished else None,
            prompt_logprobs=self.prompt_logprobs,
        )
