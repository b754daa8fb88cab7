"""Multi-turn sessions (`bench sweep --endpoint chat --turns N --think-time S`): conversations whose later turns
carry the history, so the server's prefix cache can reuse it (the point's `prefix_cache_hit_rate` shows it).

The point's prompts are grouped into sessions of `turns` consecutive prompts (the workload's lengths are each
turn's *new* user message). Turn k sends every earlier user message and the assistant's actual reply, then its
own message; it is due `think_time_s` after turn k - 1's response ended. Sessions are the unit of concurrency:
`--concurrency C` keeps C sessions in flight (closed loop); in rate mode sessions start on the arrival schedule,
and `--max-concurrency` caps sessions in flight. A failed turn ends its session (the next turn has no reply to
build on). With `--duration`, no turn starts after the end; a session due before the end that never got a slot
has its first turn recorded as not sent. Each record carries `session` and `turn`.

Sessions from real conversations (`--conversations FILE`, `workloads.conversations`): each session is one recorded
conversation; turn k sends the recorded history (earlier questions and the recorded replies, not the server's) and
asks for as many tokens as the recorded reply had, so every server gets the same prompts. Conversations are taken
in a seeded order (the same in every point) until the point has --num-prompts turns (the last session cut short),
or, with only --duration, one per pool slot, cycling through the file if it is short. Every session's first user
message starts with the point's salt and the session number, so no session warms the prefix cache for another.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import aiohttp

from sweep.point.client import ClientConfig, PromptRequest, send_request
from sweep.point.records import RequestRecord
from sweep.point.runner import PointSpec, WorkloadConfig, build_prompts

if TYPE_CHECKING:
    from workloads import RequestSpec


def session_prompts(
    spec: PointSpec, workload: WorkloadConfig, tokenizer: Any, salt: str
) -> tuple[list[Any], list[list[PromptRequest]], Any]:
    """(specs, sessions, fit report) of a session point: real conversations, or `turns` synthetic prompts each."""
    if workload.conversations is not None:
        specs, sessions = conversation_sessions(
            workload.conversations, tokenizer, spec.num_prompts, spec.pool_size, workload.seed, salt,
            workload.max_model_len,
        )  # fmt: skip
        return specs, sessions, None
    pool = spec.pool_size * (spec.turns if spec.num_prompts is None else 1)  # duration: pool_size sessions
    specs, prompts, fit_report = build_prompts(workload, tokenizer, pool, salt=salt)
    return specs, group_sessions(prompts, spec.turns), fit_report


def group_sessions(prompts: list[PromptRequest], turns: int) -> list[list[PromptRequest]]:
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
) -> tuple[list[RequestSpec], list[list[PromptRequest]]]:
    """(specs, sessions) of a point: `num_requests` turns, or with None `num_sessions` conversations."""
    import numpy as np

    from workloads import RequestSpec
    from workloads.conversations import conversation_turns, load_conversations

    conversations = load_conversations(path).conversations
    order = np.random.default_rng(seed).permutation(len(conversations))
    specs: list[RequestSpec] = []
    sessions: list[list[PromptRequest]] = []
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
            session.append(PromptRequest(len(specs), None, turn.messages, turn.input_len, turn.output_len))
            specs.append(RequestSpec(turn.input_len, turn.output_len))
        sessions.append(session)
    if not specs:
        raise ValueError(f"{path}: no conversation's first turn fits --max-model-len {max_model_len}")
    return specs, [s for s in sessions if s]


async def dispatch_sessions(
    session: aiohttp.ClientSession,
    client: ClientConfig,
    sessions: list[list[PromptRequest]],
    offsets: list[float],
    t0: float,
    concurrency: int | None,
    stop_at: float | None,
    think_time_s: float,
    on_done: Callable[[], None] | None = None,
    live_history: bool = True,
) -> list[RequestRecord]:
    """Run session s from `t0 + offsets[s]` (later if `concurrency` sessions are already in flight).
    With `live_history` each turn is sent after the history of the turns before it and the server's replies;
    without it, each turn's messages already hold its (recorded) history.

    The PromptRequests are replaced in place by what was sent (the history included), so token counting and
    the point's prompts see the real requests."""
    semaphore = asyncio.Semaphore(concurrency) if concurrency else None
    records: list[RequestRecord] = []

    async def run(number: int, turns: list[PromptRequest], offset: float) -> None:
        due = t0 + offset
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if semaphore is not None:
            await semaphore.acquire()
        try:
            history: list[dict] = []
            for k, turn in enumerate(turns):
                if k > 0:
                    await asyncio.sleep(think_time_s)
                    due = time.perf_counter()
                if stop_at is not None and time.perf_counter() >= stop_at:
                    return
                own = list(turn.messages or [{"role": "user", "content": turn.prompt or ""}])
                messages = history + own if live_history else own
                sent = replace(turn, prompt=None, messages=messages, intended_send_time=due)
                turns[k] = sent
                record = await send_request(session, client, sent)
                record.session, record.turn = number, k
                records.append(record)
                if on_done is not None:
                    on_done()
                if not record.success:
                    return
                history = [*messages, {"role": "assistant", "content": record.generated_text}]
        finally:
            if semaphore is not None:
                semaphore.release()

    await asyncio.gather(*(run(s, turns, o) for s, (turns, o) in enumerate(zip(sessions, offsets, strict=True))))
    return records
