"""A rate point watched by the over-saturation detector (sweep.point.saturation), and how a point it stops ends.

With `--stop-when-saturated`, once the detector fires nothing more is sent, the requests in flight are cancelled
(each recorded as failed with `STOPPED_ERROR`: sent, never finished), requests already due but still waiting for
a `--max-concurrency` slot are recorded as not sent (`NOT_SENT_AT_STOP`), and requests not yet due are left out
of the point (counted in its `saturation.not_due`), as requests after `--duration` are.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from sweep.point.client import ClientConfig, PromptRequest, send_request
from sweep.point.records import RequestRecord
from sweep.point.runner import PointSpec, dispatch, not_sent_records
from sweep.point.saturation import NOT_SENT_AT_STOP, STOPPED_ERROR, SaturationConfig, SaturationMonitor


async def send_unless_stopped(
    session: aiohttp.ClientSession, client: ClientConfig, prompt: PromptRequest, stop: asyncio.Future[None]
) -> RequestRecord:
    """`send_request`, cancelled when `stop` is done first: then a failed record with the send and cancel times
    (what the stream had delivered is not kept)."""
    send_time = time.perf_counter()
    task = asyncio.ensure_future(send_request(session, client, prompt))
    await asyncio.wait([task, stop], return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        return task.result()
    task.cancel()
    try:
        return await task  # it may have finished in the meantime
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if not task.cancelled() or (current is not None and current.cancelling()):
            raise  # the sweep itself is being interrupted
    now = time.perf_counter()
    return RequestRecord(
        index=prompt.index,
        requested_input_len=prompt.input_len,
        requested_output_len=prompt.output_len,
        intended_send_time=prompt.intended_send_time,
        send_time=send_time,
        error=STOPPED_ERROR,
        end_time=now,
    )


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
    result: dict[str, Any] = {"fired": monitor.fired, "stopped": monitor.stopped.done()}
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
