"""OpenAI request parsing and validation: JSON bodies → typed requests with SamplingParams, OpenAI error bodies.

Known fields are type-checked strictly (a bool is not an int, a string is not a number); unknown fields are
ignored, as vLLM does, so load generators that send extra knobs (`best_of: 1`, ...) keep working.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from engine.sampling_params import SamplingParams, SamplingParamsError

_MISSING = object()
MAX_N = 128  # completions per request, OpenAI's limit: each is an engine request


class ApiError(Exception):
    """An error answered with OpenAI's body: {"error": {"message", "type", "param", "code"}}."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def to_body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_value" if param else None)


# ---------------------------------------------------------------------------------------------- field readers


def _type_error(name: str, expected: str, value: Any) -> ApiError:
    return bad_request(f"'{name}' must be {expected}, got {type(value).__name__} {value!r:.60}", name)


_INT64 = (-(2**63), 2**63 - 1)


def get_int(body: dict[str, Any], name: str, default: Any = None) -> Any:
    value = body.get(name, _MISSING)
    if value is _MISSING or value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        # JSON numbers like 16.0 are accepted as integers, as OpenAI does.
        if not (isinstance(value, float) and value.is_integer()):
            raise _type_error(name, "an integer", value)
        value = int(value)
    if not _INT64[0] <= value <= _INT64[1]:  # e.g. a seed torch cannot take would crash the engine
        raise bad_request(f"'{name}' must fit in a signed 64-bit integer, got {value!r:.30}", name)
    return value


def get_float(body: dict[str, Any], name: str, default: Any = None) -> Any:
    value = body.get(name, _MISSING)
    if value is _MISSING or value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _type_error(name, "a number", value)
    if not math.isfinite(value):
        raise bad_request(f"'{name}' must be a finite number", name)
    return float(value)


def get_bool(body: dict[str, Any], name: str, default: Any = None) -> Any:
    value = body.get(name, _MISSING)
    if value is _MISSING or value is None:
        return default
    if not isinstance(value, bool):
        raise _type_error(name, "a boolean", value)
    return value


def get_str(body: dict[str, Any], name: str, default: Any = None) -> Any:
    value = body.get(name, _MISSING)
    if value is _MISSING or value is None:
        return default
    if not isinstance(value, str):
        raise _type_error(name, "a string", value)
    return value


def get_int_list(body: dict[str, Any], name: str) -> list[int]:
    value = body.get(name)
    if value is None:
        return []
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise _type_error(name, "a list of integers", value)
    if any(not 0 <= v <= _INT64[1] for v in value):
        raise bad_request(f"'{name}' must hold token ids (non-negative integers)", name)
    return value


def get_stop(body: dict[str, Any]) -> list[str]:
    value = body.get("stop")
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise _type_error("stop", "a string or a list of strings", value)
    if any(not s for s in stops):
        raise bad_request("'stop' strings must be non-empty", "stop")
    return stops


def reject_unsupported(body: dict[str, Any], name: str, allowed: tuple[Any, ...], why: str) -> None:
    value = body.get(name)
    if value is not None and value not in allowed:
        raise bad_request(f"'{name}' is not supported by this server: {why}", name)


# ---------------------------------------------------------------------------------------------- requests


@dataclass
class StreamOptions:
    include_usage: bool = False
    continuous_usage_stats: bool = False


@dataclass
class GenerationRequest:
    """What both endpoints hand to the serving layer once the body is valid."""

    model: str | None
    sampling_params: SamplingParams
    stream: bool
    stream_options: StreamOptions
    max_tokens_param: str  # the name the client used ("max_tokens" or "max_completion_tokens"), for errors
    # The field the client constrained the output with (response_format, structured_outputs, guided_*), for errors.
    structured_outputs_param: str | None = None


@dataclass
class CompletionRequest(GenerationRequest):
    prompt: str | list[int] = ""
    logprobs: int | None = None
    echo: bool = False  # the prompt precedes each choice's text (and, with logprobs, its prompt_logprobs)
    prompt_token_ids: list[int] = field(default_factory=list)  # set when the engine request is built


@dataclass
class ChatCompletionRequest(GenerationRequest):
    messages: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True
    logprobs: bool = False
    top_logprobs: int = 0


def _parse_stream(body: dict[str, Any]) -> tuple[bool, StreamOptions]:
    stream = get_bool(body, "stream", False)
    raw = body.get("stream_options")
    if raw is None:
        return stream, StreamOptions()
    if not isinstance(raw, dict):
        raise _type_error("stream_options", "an object", raw)
    if not stream:
        raise bad_request("'stream_options' can only be set when 'stream' is true", "stream_options")
    return stream, StreamOptions(
        include_usage=get_bool(raw, "include_usage", False),
        continuous_usage_stats=get_bool(raw, "continuous_usage_stats", False),
    )


def _sampling_params(body: dict[str, Any], max_tokens: int | None, logprobs: int | None) -> SamplingParams:
    n = get_int(body, "n", 1)
    if not 1 <= n <= MAX_N:
        raise bad_request(f"'n' must be in [1, {MAX_N}], got {n}", "n")
    best_of = get_int(body, "best_of", None)
    if best_of not in (None, 1):
        raise bad_request(f"only best_of=1 is supported, got best_of={best_of}", "best_of")
    if body.get("logit_bias"):
        raise bad_request("'logit_bias' is not supported by this server", "logit_bias")
    max_tokens_param = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    fields: dict[str, Any] = {
        "n": n,
        "temperature": get_float(body, "temperature", 1.0),
        "top_p": get_float(body, "top_p", 1.0),
        "top_k": get_int(body, "top_k", 0),
        "min_p": get_float(body, "min_p", 0.0),
        "presence_penalty": get_float(body, "presence_penalty", 0.0),
        "frequency_penalty": get_float(body, "frequency_penalty", 0.0),
        "repetition_penalty": get_float(body, "repetition_penalty", 1.0),
        "seed": get_int(body, "seed", None),
        "stop": get_stop(body),
        "stop_token_ids": get_int_list(body, "stop_token_ids"),
        "ignore_eos": get_bool(body, "ignore_eos", False),
        "min_tokens": get_int(body, "min_tokens", 0),
        "skip_special_tokens": get_bool(body, "skip_special_tokens", True),
        "include_stop_str_in_output": get_bool(body, "include_stop_str_in_output", False),
        "max_tokens": max_tokens,
        "logprobs": logprobs,
        "structured_outputs": structured_outputs(body)[0],
    }
    if max_tokens is not None and max_tokens < 1:
        raise bad_request(f"'{max_tokens_param}' must be at least 1, got {max_tokens}", max_tokens_param)
    if fields["min_tokens"] < 0:
        raise bad_request(f"'min_tokens' must be >= 0, got {fields['min_tokens']}", "min_tokens")
    try:
        return SamplingParams(**fields)
    except SamplingParamsError as error:
        message = str(error)
        param = message.split(" ", 1)[0]
        if param == "max_tokens":
            param = max_tokens_param
        raise bad_request(message, param if param in fields or param == max_tokens_param else None) from error


def structured_outputs(body: dict[str, Any]) -> tuple[Any, str | None]:
    """(StructuredOutputsParams or None, the field it came from): engine/entrypoints/structured_request.py."""
    from engine.entrypoints.structured_request import parse_structured_outputs

    return parse_structured_outputs(body)


def _model(body: dict[str, Any]) -> str | None:
    return get_str(body, "model", None)


def parse_completion_request(body: Any) -> CompletionRequest:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    prompt = body.get("prompt", _MISSING)
    if prompt is _MISSING or prompt is None:
        raise bad_request("'prompt' is required", "prompt")
    # OpenAI accepts a batch of prompts; this server takes one prompt per request, so a batch of one is unwrapped.
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise bad_request(f"only one prompt per request is supported, got {len(prompt)}", "prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise bad_request("'prompt' must not be empty", "prompt")
    elif isinstance(prompt, list):
        if not prompt:
            raise bad_request("'prompt' must not be empty", "prompt")
        if any(isinstance(t, bool) or not isinstance(t, int) for t in prompt):
            raise _type_error("prompt", "a string or a list of token ids", body["prompt"])
    else:
        raise _type_error("prompt", "a string or a list of token ids", prompt)
    echo = get_bool(body, "echo", False)
    reject_unsupported(body, "suffix", ("",), "insertion is not implemented")
    logprobs = get_int(body, "logprobs", None)
    if logprobs is not None and not 0 <= logprobs <= 20:
        raise bad_request(f"'logprobs' must be in [0, 20], got {logprobs}", "logprobs")
    max_tokens = get_int(body, "max_tokens", 16)  # OpenAI's completions default
    stream, stream_options = _parse_stream(body)
    if echo and stream:
        raise bad_request("'echo' is supported without 'stream' only", "echo")
    sampling_params = _sampling_params(body, max_tokens, logprobs)
    if echo and logprobs is not None:  # vLLM: echoed prompt tokens get their logprobs too
        sampling_params.prompt_logprobs = logprobs
    return CompletionRequest(
        model=_model(body),
        sampling_params=sampling_params,
        stream=stream,
        stream_options=stream_options,
        max_tokens_param="max_tokens",
        structured_outputs_param=structured_outputs(body)[1],
        prompt=prompt,
        logprobs=logprobs,
        echo=echo,
    )


_CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


def _parse_messages(raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        raise bad_request("'messages' is required", "messages")
    if not isinstance(raw, list):
        raise _type_error("messages", "a list of message objects", raw)
    if not raw:
        raise bad_request("'messages' must not be empty", "messages")
    messages = []
    for i, message in enumerate(raw):
        param = f"messages[{i}]"
        if not isinstance(message, dict):
            raise _type_error(param, "an object with 'role' and 'content'", message)
        role = message.get("role")
        if role not in _CHAT_ROLES:
            raise bad_request(f"'{param}.role' must be one of {', '.join(_CHAT_ROLES)}, got {role!r}", param)
        content = message.get("content")
        if isinstance(content, list):  # content parts: only text is supported
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise bad_request(f"'{param}.content' parts must be {{'type': 'text', 'text': str}}", param)
                texts.append(part["text"])
            content = "".join(texts)
        elif content is None and role == "assistant":
            content = ""
        elif not isinstance(content, str):
            raise _type_error(f"{param}.content", "a string or a list of text parts", content)
        messages.append({"role": role, "content": content})
    return messages


def parse_chat_request(body: Any) -> ChatCompletionRequest:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    messages = _parse_messages(body.get("messages"))
    for name in ("tools", "functions"):
        if body.get(name):
            raise bad_request(f"'{name}' is not supported yet: tool calling is not implemented", name)
    reject_unsupported(body, "tool_choice", ("none",), "tool calling is not implemented")
    logprobs = get_bool(body, "logprobs", False)
    top_logprobs = get_int(body, "top_logprobs", 0)
    if not 0 <= top_logprobs <= 20:
        raise bad_request(f"'top_logprobs' must be in [0, 20], got {top_logprobs}", "top_logprobs")
    if top_logprobs and not logprobs:
        raise bad_request("'top_logprobs' requires 'logprobs': true", "top_logprobs")
    max_tokens = get_int(body, "max_completion_tokens", None)
    if max_tokens is None:
        max_tokens = get_int(body, "max_tokens", None)
    stream, stream_options = _parse_stream(body)
    return ChatCompletionRequest(
        model=_model(body),
        sampling_params=_sampling_params(body, max_tokens, top_logprobs if logprobs else None),
        stream=stream,
        stream_options=stream_options,
        max_tokens_param="max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens",
        structured_outputs_param=structured_outputs(body)[1],
        messages=messages,
        add_generation_prompt=get_bool(body, "add_generation_prompt", True),
        logprobs=logprobs,
        top_logprobs=top_logprobs,
    )
