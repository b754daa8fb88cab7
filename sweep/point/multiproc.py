"""`--client-procs N`: one point's requests over N client processes, one shared queue and one global cap.

With a concurrency cap (closed loop, or rate mode with `--max-concurrency C`) the cap's C slots are split over the
processes as worker loops, and every worker takes the next request, in schedule order, from one counter shared by
all processes. A free slot in any process takes the next due request, so the total in flight is C until the queue
is empty, exactly as with one process (a fixed share of requests per process left one shard queueing while
another idled, and the closed loop's tail ran below C). Without a cap nothing queues: request i goes to process
i mod N. Every process sleeps to the same absolute `t0 + offset` deadlines: perf_counter is CLOCK_MONOTONIC on
Linux, one clock for all processes, so their records merge on one time axis. The parent resets the prefix cache
and runs the warm-ups while the children start up.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import aiohttp

from sweep.point.client import ClientConfig, PromptRequest, make_session, preconnect, send_request
from sweep.point.records import RequestRecord
from sweep.point.runner import PointSpec, dispatch, prepare_point
from sweep.point.server_metrics import ServerMetricsSampler

READY_TIMEOUT_S = 120.0
START_MARGIN_S = 0.2


def split_concurrency(concurrency: int | None, procs: int) -> list[int | None]:
    if concurrency is None:
        return [None] * procs
    return [concurrency // procs + (k < concurrency % procs) for k in range(procs)]


async def shared_queue_dispatch(
    session: aiohttp.ClientSession,
    client: ClientConfig,
    prompts: list[PromptRequest],
    offsets: list[float],
    t0: float,
    slots: int,
    stop_at: float | None,
    next_index: Any,
    on_done: Callable[[], None] | None = None,
) -> list[RequestRecord]:
    """`slots` worker loops; each takes the next request from the counter `next_index` (shared by every process),
    sleeps to its due time and sends it. A request taken at or after `stop_at` is not sent (the parent records it
    as not sent when it was due)."""
    records: list[RequestRecord] = []

    def take() -> int:
        with next_index.get_lock():
            index = next_index.value
            next_index.value += 1
        return index

    async def worker() -> None:
        while (i := take()) < len(prompts):
            prompt = prompts[i]
            prompt.intended_send_time = t0 + offsets[i]
            delay = prompt.intended_send_time - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if stop_at is not None and time.perf_counter() >= stop_at:
                return
            records.append(await send_request(session, client, prompt))
            if on_done is not None:
                on_done()

    await asyncio.gather(*(worker() for _ in range(slots)))
    return records


def _child(
    client: ClientConfig,
    prompts: list[PromptRequest],
    offsets: list[float],
    slots: int | None,
    duration: float | None,
    conn: Connection,
    counter: Any,
    next_index: Any,
) -> None:
    """`slots` set: worker loops on the shared queue; None: send this shard (no cap) on its schedule."""

    def advance() -> None:
        with counter.get_lock():
            counter.value += 1

    async def main() -> tuple[list[RequestRecord], float]:
        async with make_session() as session:
            await preconnect(session, client, min(slots or len(prompts), len(prompts)))
            conn.send("ready")
            t0 = await asyncio.get_running_loop().run_in_executor(None, conn.recv)
            stop_at = t0 + duration if duration is not None else None
            cpu_start = time.process_time()
            if slots is None:
                records = await dispatch(session, client, prompts, offsets, t0, None, stop_at, advance)
            else:
                records = await shared_queue_dispatch(
                    session, client, prompts, offsets, t0, slots, stop_at, next_index, advance
                )
            return records, time.process_time() - cpu_start

    try:
        conn.send(("records", asyncio.run(main())))
    except BaseException as e:  # report any failure to the parent instead of dying silently
        conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        conn.close()


def run_point_sharded(
    client: ClientConfig,
    spec: PointSpec,
    prompts: list[PromptRequest],
    offsets: list[float],
    warmups: list[PromptRequest],
    reset_cache: bool,
    procs: int,
    on_done: Callable[[], None] | None,
    sampler: ServerMetricsSampler | None = None,
) -> tuple[list[RequestRecord], float, float, dict[str, Any]]:
    if spec.concurrency is not None:
        procs = min(procs, spec.concurrency)
    procs = max(1, min(procs, len(prompts)))
    ctx = mp.get_context("spawn")
    counter = ctx.Value("i", 0)
    next_index = ctx.Value("i", 0)
    shares = split_concurrency(spec.concurrency, procs)
    pipes, workers = [], []
    for k in range(procs):
        parent_end, child_end = ctx.Pipe()
        # capped: every process holds the whole schedule and takes from the shared queue; uncapped: its shard
        share = (prompts, offsets) if shares[k] is not None else (prompts[k::procs], offsets[k::procs])
        worker = ctx.Process(
            target=_child,
            args=(client, *share, shares[k], spec.duration, child_end, counter, next_index),
            daemon=True,
        )
        worker.start()
        child_end.close()
        pipes.append(parent_end)
        workers.append(worker)
    try:
        extras = asyncio.run(_prepare(client, spec, warmups, reset_cache))
        for k, pipe in enumerate(pipes):
            if not pipe.poll(READY_TIMEOUT_S):
                raise RuntimeError(f"client process {k} did not start within {READY_TIMEOUT_S:.0f} s")
            message = pipe.recv()
            if message != "ready":
                raise RuntimeError(f"client process {k} failed to start: {message[1]}")
        if sampler is not None:
            sampler.begin()
        t0 = time.perf_counter() + START_MARGIN_S
        for pipe in pipes:
            pipe.send(t0)
        records: list[RequestRecord] = []
        cpu_s = 0.0
        pending = dict(enumerate(pipes))
        seen = 0
        while pending:
            for k, pipe in list(pending.items()):
                if pipe.poll(0.05):
                    kind, payload = pipe.recv()
                    if kind == "error":
                        raise RuntimeError(f"client process {k} failed: {payload}")
                    records += payload[0]
                    cpu_s += payload[1]
                    del pending[k]
            if on_done is not None:
                while seen < counter.value:
                    seen += 1
                    on_done()
    finally:
        for worker in workers:
            worker.join(timeout=5)
            if worker.is_alive():
                worker.kill()
    if sampler is not None:
        extras["server_metrics"] = sampler.end()
    end = max((r.end_time or r.send_time for r in records), default=t0)
    extras["client_procs"] = procs
    extras["client_cpu_s"] = cpu_s  # CPU the client processes spent while the point ran
    return records, t0, end - t0, extras


async def _prepare(
    client: ClientConfig, spec: PointSpec, warmups: list[PromptRequest], reset_cache: bool
) -> dict[str, Any]:
    async with make_session() as session:
        return await prepare_point(session, client, spec, warmups, reset_cache)
