"""Multi-turn sessions (`bench sweep --endpoint chat --turns N --think-time S`): conversations whose later turns
carry the history, so the server's prefix cache can reuse it (the point's `prefix_cache_hit_rate` shows it).

The point's prompts are grouped into sessions of `turns` consecutive prompts (the workload's lengths are each
turn's *new* user message). Turn k sends every earlier user message and the assistant's actual reply, then its
own message; it is due `think_time_s` after turn k - 1's response ended. Sessions are the unit of concurrency:
`--concurrency C` keeps C sessions in flight (closed loop); in rate mode sessions start on the arrival schedule,
and `--max-concurrency` caps sessions in flight. A failed turn ends its session (the next turn has no reply to
build on). With `--duration`, no turn starts after the end; a session due before the end that never got a slot
has its first turn recorded as not sent. Each record carries `session` and `turn`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace

import aiohttp

from sweep.client import ClientConfig, PromptRequest, send_request
from sweep.records import RequestRecord


def group_sessions(prompts: list[PromptRequest], turns: int) -> list[list[PromptRequest]]:
    """Consecutive prompts form sessions of `turns` (the last one may be shorter)."""
    return [prompts[i : i + turns] for i in range(0, len(prompts), turns)]


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
) -> list[RequestRecord]:
    """Run session s from `t0 + offsets[s]` (later if `concurrency` sessions are already in flight).

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
                messages = history + list(turn.messages or [{"role": "user", "content": turn.prompt or ""}])
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
