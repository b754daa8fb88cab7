"""A rate point watched by the over-saturation detector (sweep.point.saturation), and how a point it stops ends.

With `--stop-when-saturated`, once the detector fires nothing more is sent, the requests in flight are cancelled
(each recorded as failed with `STOPPED_ERROR`: sent, never finished), requests already due but still waiting for
a `--max-concurrency` slot are recorded as not sent (`NOT_SENT_AT_STOP`), and requests not yet due are left out
of the point (counted in its `saturation.not_due`), as requests after `--duration` are.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from sweep.point.client import ClientConfig, PromptRequest
from sweep.point.records import RequestRecord
from sweep.point.runner import PointSpec, dispatch, not_sent_records
from sweep.point.saturation import (
    NOT_SENT_AT_STOP,
    STOPPED_ERROR,
    SaturationConfig,
    SaturationMonitor,
    service_time_p90,
)

Send = Callable[[PromptRequest, float], Awaitable[RequestRecord | None]]


def stoppable(send: Send, stop: asyncio.Future[None], sent_at: dict[int, float]) -> Send:
    """`dispatch`'s per-request coroutine, cancelled when `stop` is done: one done-callback on `stop` cancels every
    request still sleeping to its due time, queued for a slot or in flight. A request cancelled in flight becomes a
    failed record (`STOPPED_ERROR`, its send time from `sent_at`, what it had streamed not kept); one cancelled
    before it was sent gives no record. Any other cancellation (the sweep interrupted) propagates."""
    waiting: set[asyncio.Task] = set()

    def cancel_all(_: asyncio.Future[None]) -> None:
        for task in list(waiting):
            task.cancel()

    stop.add_done_callback(cancel_all)

    async def send_unless_stopped(prompt: PromptRequest, offset: float) -> RequestRecord | None:
        task = asyncio.current_task()
        assert task is not None
        waiting.add(task)
        try:
            return await send(prompt, offset)
        except asyncio.CancelledError:
            if not stop.done():
                raise
            if prompt.index not in sent_at:
                return None
            return RequestRecord(
                index=prompt.index,
                requested_input_len=prompt.input_len,
                requested_output_len=prompt.output_len,
                intended_send_time=prompt.intended_send_time,
                send_time=sent_at[prompt.index],
                error=STOPPED_ERROR,
                end_time=time.perf_counter(),
            )
        finally:
            waiting.discard(task)

    return send_unless_stopped


async def dispatch_watched(
    session: aiohttp.ClientSession,
    client: ClientConfig,
    prompts: list[PromptRequest],
    offsets: list[float],
    t0: float,
    concurrency: int | None,
    stop_at: float | None,
    on_done: Callable[[], None] | None,
    config: SaturationConfig,
) -> tuple[list[RequestRecord], dict[str, Any]]:
    """`dispatch` with the saturation detector watching (sweep.point.saturation); with `config.stop` the point
    ends where it fires. Returns the records and the detector's result for `saturation.saturation_fields`."""
    monitor = SaturationMonitor(config, offsets, t0)
    watcher = asyncio.ensure_future(monitor.watch())
    try:
        records = await dispatch(
            session, client, prompts, offsets, t0, concurrency, stop_at, on_done, monitor.record_done,
            monitor.stopped if config.stop else None,
        )
    finally:
        watcher.cancel()
    result: dict[str, Any] = monitor.result()
    if monitor.fired is None:
        result["service_p90_s"] = service_time_p90(records)
    if monitor.stopped.done():
        result["cancelled"] = sum(r.error == STOPPED_ERROR for r in records)
    return records, result


def stopped_point_records(
    spec: PointSpec,
    prompts: list[PromptRequest],
    offsets: list[float],
    t0: float,
    records: list[RequestRecord],
    result: dict[str, Any],
) -> tuple[list[PromptRequest], list[RequestRecord]]:
    """A stopped point's prompts and records: those due by the stop (the not-sent ones recorded as such); the
    count of requests never due goes into `result["not_due"]`."""
    stop_offset = result["fired"].at_s
    sent = {r.index for r in records}
    kept = [i for i, o in enumerate(offsets) if o <= stop_offset or prompts[i].index in sent]
    result["not_due"] = len(prompts) - len(kept)
    prompts, offsets = [prompts[i] for i in kept], [offsets[i] for i in kept]
    result["not_sent"] = len(prompts) - len(sent)
    return prompts, records + not_sent_records(spec, prompts, offsets, t0, records, NOT_SENT_AT_STOP)
