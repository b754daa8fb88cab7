"""Multi-turn sessions (`bench sweep --endpoint chat --turns N --think-time S`): conversations whose later turns
carry the history, so the server's prefix cache can reuse it (the point's `prefix_cache_hit_rate` shows it).

The point's prompts are grouped into sessions of `turns` consecutive prompts (the workload's lengths are each
turn's *new* user message). Turn k sends every earlier user message and the assistant's actual reply, then its
own message; it is due `think_time_s` after turn k - 1's response ended. Sessions are the unit of concurrency:
`--concurrency C` keeps C sessions in flight (closed loop); in rate mode sessions start on the arrival schedule,
and `--max-concurrency` caps sessions in flight. A failed turn ends its session (the next turn has no reply to
build on). With `--duration`, no turn starts after the end; a session due before the end that never got a slot
has its first turn recorded as not sent. Each record carries `session` and `turn`.

The prompts, real conversations' included, are workloads.sessions'; this module sends them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import aiohttp

from sweep.point.client import ClientConfig, PromptRequest, send_request
from sweep.point.prompts import build_prompts, prompt_requests
from sweep.point.records import RequestRecord
from workloads.sessions import conversation_sessions, group_sessions

if TYPE_CHECKING:
    from sweep.point.runner import PointSpec, WorkloadConfig


def session_prompts(
    spec: PointSpec, workload: WorkloadConfig, tokenizer: Any, salt: str
) -> tuple[list[Any], list[list[PromptRequest]], Any]:
    """(specs, sessions, fit report) of a session point: real conversations, or `turns` synthetic prompts each."""
    if workload.conversations is not None:
        specs, conversations = conversation_sessions(
            workload.conversations, tokenizer, spec.num_prompts, spec.pool_size, workload.seed, salt,
            workload.max_model_len,
        )  # fmt: skip
        turns = prompt_requests([turn for session in conversations for turn in session])
        return specs, group_by_lengths(turns, [len(session) for session in conversations]), None
    pool = spec.pool_size * (spec.turns if spec.num_prompts is None else 1)  # duration: pool_size sessions
    specs, prompts, fit_report = build_prompts(workload, tokenizer, pool, salt=salt)
    return specs, group_sessions(prompts, spec.turns), fit_report


def group_by_lengths(prompts: list[PromptRequest], lengths: list[int]) -> list[list[PromptRequest]]:
    """`prompts` cut into consecutive sessions of `lengths` turns."""
    sessions, start = [], 0
    for length in lengths:
        sessions.append(prompts[start : start + length])
        start += length
    return sessions


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
