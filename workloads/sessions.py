"""Multi-turn sessions' prompts (`bench sweep --endpoint chat --turns N` or `--conversations FILE`): a point's
prompts grouped into sessions of `turns`, or sessions from real conversations (`workloads.conversations`).

Sessions from real conversations: each session is one recorded conversation; turn k carries the recorded history
(earlier questions and the recorded replies, not the server's) and asks for as many tokens as the recorded reply
had, so every server gets the same prompts. Conversations are taken in a seeded order (the same in every point)
until the point has `num_requests` turns (the last session cut short), or, with None, `num_sessions` of them,
cycling through the file if it is short. Every session's first user message starts with the salt and the session
number, so no session warms the prefix cache for another. Sending them is the sweep's (sweep/point/sessions.py).
"""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np

from workloads.conversations import conversation_turns, load_conversations
from workloads.spec import RequestSpec, SynthesizedPrompt

Prompt = TypeVar("Prompt")


def group_sessions(prompts: list[Prompt], turns: int) -> list[list[Prompt]]:
    """Consecutive prompts form sessions of `turns` (the last one may be shorter)."""
    return [prompts[i : i + turns] for i in range(0, len(prompts), turns)]


def conversation_sessions(
    path: str,
    tokenizer: Any,
    num_requests: int | None,
    num_sessions: int,
    seed: int,
    salt: str,
    max_model_len: int | None = None,
) -> tuple[list[RequestSpec], list[list[SynthesizedPrompt]]]:
    """(specs, sessions) of a point: `num_requests` turns, or with None `num_sessions` conversations."""
    conversations = load_conversations(path).conversations
    order = np.random.default_rng(seed).permutation(len(conversations))
    specs: list[RequestSpec] = []
    sessions: list[list[SynthesizedPrompt]] = []
    while (len(specs) < num_requests) if num_requests is not None else (len(sessions) < num_sessions):
        if len(sessions) >= len(conversations) and not specs:
            break  # a whole pass without one turn that fits
        number = len(sessions)
        conversation = conversations[order[number % len(conversations)]]
        turns = conversation_turns(conversation, tokenizer, f"{salt}-s{number}", max_model_len)
        if num_requests is not None:
            del turns[num_requests - len(specs) :]
        session = []
        for turn in turns:
            session.append(SynthesizedPrompt(None, turn.messages, turn.input_len, turn.output_len))
            specs.append(RequestSpec(turn.input_len, turn.output_len))
        sessions.append(session)
    if not specs:
        raise ValueError(f"{path}: no conversation's first turn fits --max-model-len {max_model_len}")
    return specs, [s for s in sessions if s]
