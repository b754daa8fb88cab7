"""Prompt synthesis for a tokenizer: every prompt is exactly `input_len` tokens as the server will count them.

Prompts are built from a pool of whole-word tokens (" word" tokens that encode to themselves and concatenate
without merging), so a prompt of k words is almost always k tokens plus the tokenizer's fixed overhead
(BOS, chat template). Each prompt is measured; the few that miss are adjusted by a word or two at the end and
measured again, all in batches, so 1,000 prompts take about a second.

Raw prompts (/v1/completions) are counted as `len(tokenizer(prompt).input_ids)` (special tokens included, as a
server counts them); chat prompts as the rendered chat template (add_generation_prompt=True) encoded without
adding special tokens, which is what vLLM's chat endpoint does.

Cache hygiene: every random choice is seeded by (salt, seed, role, key). The salt is a fresh uuid per call unless
given, so a rerun never finds its prompts in a warm prefix cache; different seeds draw independent words, so
they share no prefix except by 1-in-|pool|^n chance. Shared structure is deliberate only: requests with equal
hash ids get identical blocks of tokens, and requests in one prefix group share the group's system prompt.
"""

from __future__ import annotations

import hashlib
import re
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from workloads.spec import RequestSpec, SynthesizedPrompt

ENDPOINTS = ("completions", "chat")
MAX_ADJUST_ROUNDS = 12
_WORD = re.compile(r" [a-z]{3,12}")
_POOLS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_ROLE_HASH_BLOCK, _ROLE_GROUP, _ROLE_BODY = 1, 2, 3


@dataclass(frozen=True)
class WordPool:
    ids: np.ndarray  # token ids of single-token words
    texts: tuple[str, ...]  # texts[i] decodes ids[i]

    def text(self, words: Sequence[int]) -> str:
        texts = self.texts
        return "".join(texts[word] for word in words)


def word_pool(tokenizer: Any) -> WordPool:
    """Single-token " word" tokens of this tokenizer that encode back to themselves (built once per tokenizer)."""
    cached = _POOLS.get(tokenizer)
    if cached is not None:
        return cached
    texts = tokenizer.batch_decode([[token_id] for token_id in range(len(tokenizer))])
    candidates = [token_id for token_id, text in enumerate(texts) if _WORD.fullmatch(text)]
    encoded = tokenizer([texts[i] for i in candidates], add_special_tokens=False)["input_ids"] if candidates else []
    words = [token_id for token_id, ids in zip(candidates, encoded, strict=True) if ids == [token_id]]
    if len(words) < 256:
        # SentencePiece-style tokenizers encode " word" with an extra piece; keep words that end in themselves.
        words = [token_id for token_id, ids in zip(candidates, encoded, strict=True) if ids[-1:] == [token_id]]
    if len(words) < 256:
        raise ValueError(f"tokenizer {type(tokenizer).__name__} has only {len(words)} whole-word tokens; need 256")
    pool = WordPool(np.array(words, dtype=np.int64), tuple(texts[token_id] for token_id in words))
    _POOLS[tokenizer] = pool
    return pool


def _salt_key(salt: str) -> int:
    return int.from_bytes(hashlib.sha256(salt.encode()).digest()[:8], "little")


class _Words:
    """Deterministic word streams (indices into the pool) for hash blocks, group prompts and request bodies."""

    def __init__(self, pool: WordPool, seed: int, salt: str) -> None:
        self.size = len(pool.ids)
        self.base = [seed & 0xFFFFFFFF, _salt_key(salt)]
        self.blocks: dict[tuple[int, int], np.ndarray] = {}

    def stream(self, role: int, key: int, length: int) -> np.ndarray:
        rng = np.random.default_rng(self.base + [role, key & 0xFFFFFFFFFFFF])
        return rng.integers(0, self.size, size=length)

    def cached(self, role: int, key: int, length: int) -> np.ndarray:
        block = self.blocks.get((role, key))
        if block is None or len(block) < length:
            block = self.blocks[(role, key)] = self.stream(role, key, length)
        return block[:length]


def _shared_words(spec: RequestSpec, words: _Words, block_size: int) -> np.ndarray:
    if spec.prefix_ids:
        size = spec.prefix_block_size or block_size
        return np.concatenate([words.cached(_ROLE_HASH_BLOCK, hash_id, size) for hash_id in spec.prefix_ids])
    if spec.prefix_group is not None and spec.prefix_len:
        return words.cached(_ROLE_GROUP, spec.prefix_group, spec.prefix_len)
    return np.zeros(0, dtype=np.int64)


CHUNK = 256


def chat_prompt_len(tokenizer: Any, messages: list[dict]) -> int:
    """Tokens of `messages` rendered by the tokenizer's chat template, generation prompt included."""
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return len(ids["input_ids"] if hasattr(ids, "keys") else ids)


class _Measure:
    """Token counts of candidate prompts, batched."""

    def __init__(self, tokenizer: Any, pool: WordPool, endpoint: str) -> None:
        self.tokenizer, self.pool, self.endpoint = tokenizer, pool, endpoint

    def render(self, shared: np.ndarray, body: np.ndarray, system: bool) -> tuple[str | None, list[dict] | None]:
        if self.endpoint == "completions":
            return self.pool.text(np.concatenate([shared, body])), None
        if system:
            return None, [
                {"role": "system", "content": self.pool.text(shared)},
                {"role": "user", "content": self.pool.text(body)},
            ]
        return None, [{"role": "user", "content": self.pool.text(np.concatenate([shared, body]))}]

    def counts(self, rendered: list[tuple[str | None, list[dict] | None]]) -> list[int]:
        if self.endpoint == "completions":
            texts = [prompt or "" for prompt, _ in rendered]
            return [len(ids) for ids in self.tokenizer(texts, add_special_tokens=True)["input_ids"]]
        texts = [
            self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            for _, messages in rendered
        ]
        return [len(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]

    def counts_in_chunks(self, rendered: list[tuple[str | None, list[dict] | None]], show_progress: bool) -> list[int]:
        chunks = [rendered[start : start + CHUNK] for start in range(0, len(rendered), CHUNK)]
        if not show_progress:
            return [count for chunk in chunks for count in self.counts(chunk)]
        from rich.progress import track

        return [count for chunk in track(chunks, description="measuring prompts") for count in self.counts(chunk)]


def synthesize(
    specs: Sequence[RequestSpec],
    tokenizer: Any,
    *,
    endpoint: str = "completions",
    seed: int = 0,
    salt: str | None = None,
    block_size: int = 16,
    show_progress: bool = False,
    too_short: str = "clamp",
) -> list[SynthesizedPrompt]:
    """Prompts of exactly spec.input_len tokens for `tokenizer` (any HF tokenizer).

    block_size is the tokens per hash id for specs that do not say (spec.prefix_block_size; Mooncake says 512).
    A target below the endpoint's fixed overhead (the chat template's own tokens, e.g. 30 for SmolLM2) cannot be
    met: too_short="clamp" (the default) sends the shortest possible prompt and records it (prompt.input_len is
    the realised count, extra["requested_input_len"] the spec's), too_short="error" raises ValueError.
    show_progress draws a rich progress bar over the first (largest) measuring pass.
    """
    if endpoint not in ENDPOINTS:
        raise ValueError(f"endpoint must be one of {ENDPOINTS}, got {endpoint!r}")
    if too_short not in ("clamp", "error"):
        raise ValueError(f"too_short must be 'clamp' or 'error', got {too_short!r}")
    targets = [spec.input_len for spec in specs]
    salt = uuid.uuid4().hex if salt is None else salt
    pool = word_pool(tokenizer)
    words = _Words(pool, seed, salt)
    measure = _Measure(tokenizer, pool, endpoint)
    system = [endpoint == "chat" and spec.prefix_group is not None and not spec.prefix_ids for spec in specs]
    shared = [_shared_words(spec, words, block_size) for spec in specs]
    overhead = measure.counts([measure.render(np.zeros(0, np.int64), np.zeros(0, np.int64), False)])[0]
    # word_counts[i]: words of shared + body; the body stream is long enough for any adjustment
    word_counts = [max(spec.input_len - overhead, 0) for spec in specs]
    bodies = [words.stream(_ROLE_BODY, index, count + 64) for index, count in enumerate(word_counts)]

    def render(index: int) -> tuple[str | None, list[dict] | None]:
        count, prefix = word_counts[index], shared[index]
        if count <= len(prefix):
            return measure.render(prefix[:count], prefix[:0], system[index])
        return measure.render(prefix, bodies[index][: count - len(prefix)], system[index])

    rendered = [render(index) for index in range(len(specs))]
    pending = list(range(len(specs)))
    for attempt in range(MAX_ADJUST_ROUNDS):
        counts = measure.counts_in_chunks([rendered[index] for index in pending], show_progress and attempt == 0)
        still = []
        for index, count in zip(pending, counts, strict=True):
            error = targets[index] - count
            if error == 0:
                continue
            if word_counts[index] == 0 and error < 0:
                if too_short == "error":
                    raise ValueError(
                        f"request {index}: input_len {targets[index]} is below the {endpoint} prompt's "
                        f"minimum of {count} tokens for this tokenizer"
                    )
                targets[index] = count
                continue
            step = error if attempt < MAX_ADJUST_ROUNDS // 2 else int(np.sign(error))
            word_counts[index] = max(word_counts[index] + step, 0)
            if word_counts[index] + 1 > len(bodies[index]) + len(shared[index]):
                bodies[index] = words.stream(_ROLE_BODY, index, word_counts[index] + 64)
            rendered[index] = render(index)
            still.append(index)
        pending = still
        if not pending:
            break
    if pending:
        raise RuntimeError(f"could not hit the exact token count for requests {pending[:10]} with this tokenizer")
    return [
        SynthesizedPrompt(
            prompt=prompt,
            messages=messages,
            input_len=target,
            output_len=spec.output_len,
            timestamp=spec.timestamp,
            schema=spec.schema,
            prefix_group=spec.prefix_group,
            request_class=spec.request_class,
            extra={"salt": salt} | ({"requested_input_len": spec.input_len} if target != spec.input_len else {}),
        )
        for spec, target, (prompt, messages) in zip(specs, targets, rendered, strict=True)
    ]
