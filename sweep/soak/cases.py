"""What `bench soak` sends: valid requests (chat or completions, streamed or not, shared prefixes, max_tokens up to
the context limit) and malformed ones, each with the answer it must get.

A case is plain data (method, path, body bytes, what counts as a correct answer); sweep/soak/runner.py sends it.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

# Words that tokenise to one or two tokens in the common BPE vocabularies; a prompt of W words stays under
# PROMPT_TOKENS_PER_WORD * W tokens, which keeps a valid request inside the context limit.
_WORDS = "the cat sat on a mat and then ran far away from home into dark woods where owls sing at night".split()
PROMPT_TOKENS_PER_WORD = 2
CHAT_TEMPLATE_TOKENS = 64  # the most a chat template adds around one user message
_SHARED_PREFIXES = 4  # distinct shared prefixes, so prefix-cache hits and evictions both happen

KINDS = ("valid", "cancel", "disconnect", "malformed")
MALFORMED_KINDS = ("wrong_type", "unknown_field", "over_long_prompt", "bad_stop", "huge_n", "invalid_utf8",
                   "truncated_json", "oversized_body", "not_an_object", "bad_route")  # fmt: skip


@dataclass
class SoakMix:
    """Shares of the request kinds (the rest are valid requests) and the shape of valid ones."""

    cancel: float = 0.1  # streamed, cancelled after a random number of chunks
    disconnect: float = 0.05  # the connection closes before the first response byte
    malformed: float = 0.1
    stream: float = 0.5  # of valid requests
    chat: float = 0.3  # of valid requests
    prefix: float = 0.5  # of valid requests: the prompt starts with one of a few shared prefixes
    long_output: float = 0.02  # of valid requests: max_tokens up to what the context leaves

    def __post_init__(self) -> None:
        for name in ("cancel", "disconnect", "malformed", "stream", "chat", "prefix", "long_output"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"--mix {name} must be in [0, 1], got {value}")
        if self.cancel + self.disconnect + self.malformed > 1.0:
            raise ValueError("--mix cancel + disconnect + malformed must be at most 1")

    @classmethod
    def parse(cls, text: str | None) -> SoakMix:
        """'cancel=0.1,malformed=0.2,...' → SoakMix (unnamed shares keep their defaults)."""
        values: dict[str, float] = {}
        for item in (text or "").split(","):
            if not item.strip():
                continue
            name, _, raw = item.partition("=")
            name = name.strip()
            if name not in cls.__dataclass_fields__:
                raise ValueError(f"--mix: unknown share {name!r}; known: {', '.join(cls.__dataclass_fields__)}")
            try:
                values[name] = float(raw)
            except ValueError:
                raise ValueError(f"--mix {name} takes a number, got {raw!r}") from None
        return cls(**values)


@dataclass
class SoakCase:
    """One request to send and the answer it must get."""

    kind: str  # one of KINDS
    path: str  # under the base URL's root, e.g. /v1/completions
    body: bytes
    malformed_kind: str | None = None
    stream: bool = False
    max_tokens: int | None = None  # valid requests: the completion must hold exactly this many tokens
    cancel_after_chunks: int = 0  # cancel: close the stream after this many data chunks
    accept_2xx: bool = False  # malformed: a server may also accept it (unknown fields are ignored by vLLM)
    headers: dict[str, str] = field(default_factory=dict)


def _prompt(rng: random.Random, num_words: int, prefix: int | None) -> str:
    words = [rng.choice(_WORDS) for _ in range(num_words)]
    if prefix is not None:  # a fixed 24-word head per prefix id
        head = random.Random(prefix).choices(_WORDS, k=24)
        words = head + words
    return " ".join(words)


def valid_body(rng: random.Random, mix: SoakMix, model: str | None, max_model_len: int, max_tokens_cap: int,
               stream: bool, chat: bool) -> tuple[dict[str, Any], int]:  # fmt: skip
    """A valid request body and its max_tokens (the server must produce exactly that many, ignore_eos)."""
    prefix = rng.randrange(_SHARED_PREFIXES) if rng.random() < mix.prefix else None
    num_words = rng.randint(1, 40)
    prompt = _prompt(rng, num_words, prefix)
    prompt_bound = PROMPT_TOKENS_PER_WORD * len(prompt.split()) + (CHAT_TEMPLATE_TOKENS if chat else 2)
    room = max(1, max_model_len - prompt_bound)
    if rng.random() < mix.long_output:
        max_tokens = rng.randint(max(1, room // 2), room)
    else:
        max_tokens = rng.randint(1, max(1, min(max_tokens_cap, room)))
    body: dict[str, Any] = {"max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0}
    if model is not None:
        body["model"] = model
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body, max_tokens


def malformed_case(rng: random.Random, model: str | None, max_model_len: int, oversized_bytes: int) -> SoakCase:
    """A request the server must refuse with a 4xx and an OpenAI error body (or, for unknown fields, may accept)."""
    kind = rng.choice(MALFORMED_KINDS)
    chat = rng.random() < 0.5
    path = "/v1/chat/completions" if chat else "/v1/completions"
    base: dict[str, Any] = {"max_tokens": 4}
    if model is not None:
        base["model"] = model
    if chat:
        base["messages"] = [{"role": "user", "content": "hello there"}]
    else:
        base["prompt"] = "hello there"
    accept_2xx = False
    if kind == "wrong_type":
        field_name, value = rng.choice([("max_tokens", "ten"), ("temperature", "hot"), ("stream", "yes"),
                                        ("n", 1.5), ("top_p", [1]), ("seed", {"a": 1})])  # fmt: skip
        body = json.dumps({**base, field_name: value}).encode()
    elif kind == "unknown_field":
        body = json.dumps({**base, f"x_unknown_{rng.randrange(1000)}": rng.choice([1, "a", None, [1, 2]])}).encode()
        accept_2xx = True
    elif kind == "over_long_prompt":
        long_text = " ".join(rng.choice(_WORDS) for _ in range(2 * max_model_len + 16))
        key, value = ("messages", [{"role": "user", "content": long_text}]) if chat else ("prompt", long_text)
        body = json.dumps({**base, key: value}).encode()
    elif kind == "bad_stop":
        body = json.dumps({**base, "stop": rng.choice([5, [1, 2], {"s": 1}, [""]])}).encode()
    elif kind == "huge_n":
        body = json.dumps({**base, "n": rng.choice([10**6, 10**12, -3, 0])}).encode()
    elif kind == "invalid_utf8":
        body = b'{"prompt": "\xff\xfe\xfa bad bytes", "max_tokens": 4}'
    elif kind == "truncated_json":
        full = json.dumps(base).encode()
        body = full[: rng.randint(1, len(full) - 1)]
    elif kind == "oversized_body":
        filler = "a" * oversized_bytes
        body = json.dumps({**base, "prompt": filler} if not chat else {**base, "messages": [
            {"role": "user", "content": filler}]}).encode()  # fmt: skip
    elif kind == "not_an_object":
        body = json.dumps(rng.choice([[1, 2, 3], "prompt", 42, None])).encode()
    else:  # bad_route
        path = rng.choice(["/v1/complete", "/v1/chat", "/v1/embeddingz"])
        body = json.dumps(base).encode()
    return SoakCase("malformed", path, body, malformed_kind=kind, accept_2xx=accept_2xx,
                    headers={"Content-Type": "application/json"})  # fmt: skip


def make_case(rng: random.Random, mix: SoakMix, model: str | None, max_model_len: int, max_tokens_cap: int,
              oversized_bytes: int) -> SoakCase:  # fmt: skip
    """Draw the next request from the mix."""
    draw = rng.random()
    if draw < mix.malformed:
        return malformed_case(rng, model, max_model_len, oversized_bytes)
    kind = "valid"
    if draw < mix.malformed + mix.cancel:
        kind = "cancel"
    elif draw < mix.malformed + mix.cancel + mix.disconnect:
        kind = "disconnect"
    chat = rng.random() < mix.chat
    stream = kind == "cancel" or (kind == "valid" and rng.random() < mix.stream)
    body, max_tokens = valid_body(rng, mix, model, max_model_len, max_tokens_cap, stream, chat)
    if kind == "cancel" and max_tokens < 2:
        body["max_tokens"] = max_tokens = 2
    return SoakCase(
        kind, "/v1/chat/completions" if chat else "/v1/completions", json.dumps(body).encode(), stream=stream,
        max_tokens=max_tokens, cancel_after_chunks=rng.randint(1, max(1, max_tokens - 1)) if kind == "cancel" else 0,
        headers={"Content-Type": "application/json"},
    )  # fmt: skip


def is_openai_error_body(payload: Any) -> bool:
    """OpenAI's {"error": {"message": ...}} or vLLM's older {"object": "error", "message": ...}."""
    if not isinstance(payload, dict):
        return False
    error = payload.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return True
    return payload.get("object") == "error" and isinstance(payload.get("message"), str)
