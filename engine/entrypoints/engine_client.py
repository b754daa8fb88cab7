"""The API process's side of the engine process: spawn it, feed it requests, fan its outputs out to per-request
asyncio queues.

A background thread blocks on the output queue and hands each step's message to the event loop with
`call_soon_threadsafe`; the loop only appends to queues, so no request's work waits on another's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import multiprocessing
import queue
import threading
import time
from typing import Any

from engine.config import EngineConfig
from engine.entrypoints.engine_process import (
    AbortRequests,
    AddRequest,
    EngineInfo,
    Outputs,
    RequestError,
    Shutdown,
    StartupFailed,
    UtilityCall,
    UtilityResult,
    run_engine_core,
)
from engine.entrypoints.prometheus import ServerMetrics
from engine.entrypoints.protocol import ApiError
from engine.executor.start_method import check_not_bootstrapping
from engine.layers.onednn import bound_onednn_caches_for_children
from engine.outputs import EngineCoreOutput, SchedulerStats
from engine.request import Request, RequestTiming

logger = logging.getLogger(__name__)

_POLL_INTERVAL_S = 0.2


class EngineStartupError(RuntimeError):
    """The engine process could not load the model; the message says why."""


def engine_dead_error() -> ApiError:
    return ApiError(503, "the engine process has died; restart the server", type="server_error", code="engine_dead")


OutputQueue = asyncio.Queue[tuple[EngineCoreOutput, float] | ApiError]


class RequestStream:
    """One engine request's outputs, in order, as the engine produced them. The n children of a parallel-sampling
    request share one queue (read it with `next_output`)."""

    def __init__(self, request: Request, api_arrival: float, queue: OutputQueue | None = None) -> None:
        self.request_id = request.request_id
        self.num_prompt_tokens = request.num_prompt_tokens
        self.api_arrival = api_arrival  # API-process time.monotonic()
        self.received_epoch = time.time()
        self.queue: OutputQueue = queue if queue is not None else asyncio.Queue()
        self.timing: RequestTiming | None = None  # engine-side snapshot as of the latest consumed output
        self.last_engine_time: float | None = None  # engine clock of the step that produced that output
        self.first_token_api_time: float | None = None
        self.last_token_api_time: float | None = None
        self.num_output_tokens = 0
        self.finished = False

    def record(self, output: EngineCoreOutput, engine_time: float) -> None:
        """The handler consumed `output`: keep its timing snapshot."""
        self.last_engine_time = engine_time
        if output.timing is not None:
            self.timing = output.timing

    def final_timing(self) -> RequestTiming | None:
        """Engine timing at the end: the core's own when it finished the request, else the latest snapshot
        closed at the engine time of the last output (a stop string or a disconnect ended it here)."""
        if self.timing is None:
            return None
        if self.timing.finished_time is not None:
            return self.timing
        return dataclasses.replace(self.timing, finished_time=self.last_engine_time)


async def next_output(queue: OutputQueue, streams: dict[str, RequestStream]) -> EngineCoreOutput:
    """The next output of any of `streams` (by request id), which share `queue`; an ApiError put there is raised."""
    item = await queue.get()
    if isinstance(item, ApiError):
        raise item
    output, engine_time = item
    streams[output.request_id].record(output, engine_time)
    return output


class EngineClient:
    def __init__(self, config: EngineConfig, metrics: ServerMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics
        self.info: EngineInfo | None = None
        self.stats = SchedulerStats()
        self.dead = False
        # Spawned, not forked (unlike the tensor-parallel ranks): the engine process must import torch afresh so
        # that the oneDNN cache bounds below are in its environment when torch loads.
        self._ctx = multiprocessing.get_context("spawn")
        self._input: Any = self._ctx.Queue()
        self._output: Any = self._ctx.Queue()
        self._process: Any = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._streams: dict[str, RequestStream] = {}
        self._utility_calls: dict[int, asyncio.Future[Any]] = {}
        self._call_ids = itertools.count()
        self._closing = False

    # ------------------------------------------------------------------------------------------- lifecycle

    def start(self, timeout_s: float = 1800.0) -> EngineInfo:
        """Spawn the engine process and wait until the model is loaded (blocking)."""
        check_not_bootstrapping("the engine process")
        bound_onednn_caches_for_children()
        self._process = self._ctx.Process(
            target=run_engine_core,
            args=(self.config, self._input, self._output, logging.getLogger().getEffectiveLevel()),
            name="servelab-engine-core",
        )
        self._process.start()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                message = self._output.get(timeout=_POLL_INTERVAL_S)
            except queue.Empty:
                if not self._process.is_alive():
                    raise EngineStartupError(
                        f"the engine process exited with code {self._process.exitcode} while loading the model"
                    ) from None
                if time.monotonic() > deadline:
                    self.shutdown()
                    raise EngineStartupError(f"the engine did not start within {timeout_s:.0f} s") from None
                continue
            if isinstance(message, StartupFailed):
                self._process.join(timeout=10)
                raise EngineStartupError(message.message)
            self.info = message.info
            return self.info

    @property
    def pid(self) -> int | None:
        """The engine process's id (None before start)."""
        return None if self._process is None else self._process.pid

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start dispatching outputs to `loop`; call from inside the running loop."""
        self._loop = loop
        self._thread = threading.Thread(target=self._read_outputs, name="servelab-engine-outputs", daemon=True)
        self._thread.start()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the engine process; kill it if it does not exit in time (it ignores SIGTERM), so nothing outlives
        the server."""
        self._closing = True
        if self._process is None:
            return
        if self._process.is_alive():
            self._input.put(Shutdown())
            self._process.join(timeout=timeout_s)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        if self._thread is not None:
            self._thread.join(timeout=2 * _POLL_INTERVAL_S + 1)
        self._input.cancel_join_thread()  # a dead engine never drains its pipe: do not wait on it at exit
        self._input.close()
        self._output.close()

    # ------------------------------------------------------------------------------------------- requests

    def add_request(self, request: Request, api_arrival: float, queue: OutputQueue | None = None) -> RequestStream:
        if self.dead:
            raise engine_dead_error()
        stream = RequestStream(request, api_arrival, queue)
        self._streams[request.request_id] = stream
        self._input.put(AddRequest(request))
        return stream

    def release(self, stream: RequestStream) -> None:
        """The handler is done with `stream`: abort it in the engine unless it finished there."""
        if self._streams.pop(stream.request_id, None) is not None and not stream.finished and not self.dead:
            self._input.put(AbortRequests([stream.request_id]))

    def finish_early(self, stream: RequestStream) -> None:
        """The API process ended the request (stop string): free it in the engine now and count it as done."""
        stream.finished = True
        self._streams.pop(stream.request_id, None)
        if not self.dead:
            self._input.put(AbortRequests([stream.request_id]))
        if self.metrics is not None:
            self.metrics.observe_finished(stream, stream.final_timing(), "stop")

    def fail_all(self, error: ApiError) -> None:
        """End every in-flight request with `error` (shutdown, engine death)."""
        ids = list(self._streams)
        for stream in self._streams.values():
            stream.queue.put_nowait(error)
        if ids and not self.dead:
            self._input.put(AbortRequests(ids))

    async def call_utility(self, name: str) -> Any:
        if self.dead:
            raise engine_dead_error()
        assert self._loop is not None
        call_id = next(self._call_ids)
        future = self._loop.create_future()
        self._utility_calls[call_id] = future
        self._input.put(UtilityCall(call_id, name))
        result = await future
        if isinstance(result, BaseException):
            raise result
        return result

    # ------------------------------------------------------------------------------------------- dispatch

    def _read_outputs(self) -> None:
        assert self._loop is not None
        while True:
            try:
                message = self._output.get(timeout=_POLL_INTERVAL_S)
            except queue.Empty:
                if self._closing:
                    return
                if not self._process.is_alive():
                    self._loop.call_soon_threadsafe(self._on_engine_death)
                    return
                continue
            except (EOFError, OSError):
                if not self._closing:
                    self._loop.call_soon_threadsafe(self._on_engine_death)
                return
            self._loop.call_soon_threadsafe(self._on_message, message)

    def _on_engine_death(self) -> None:
        if self._closing:
            return
        logger.error("the engine process died (exit code %s); answering 503", self._process.exitcode)
        self.dead = True
        self.fail_all(engine_dead_error())
        for future in self._utility_calls.values():
            if not future.done():
                future.set_exception(engine_dead_error())

    def _on_message(self, message: object) -> None:
        if isinstance(message, Outputs):
            now = time.monotonic()
            for output in message.outputs:
                stream = self._streams.get(output.request_id)
                if stream is not None:
                    self._deliver(stream, output, message.engine_time, now)
            self.stats = message.stats
            if self.metrics is not None:
                self.metrics.update_stats(message.stats)
        elif isinstance(message, RequestError):
            stream = self._streams.get(message.request_id)
            if stream is not None:
                stream.finished = True
                stream.queue.put_nowait(ApiError(400, message.message, param="prompt"))
        elif isinstance(message, UtilityResult):
            future = self._utility_calls.pop(message.call_id, None)
            if future is not None and not future.done():
                future.set_result(message.result)

    def _deliver(self, stream: RequestStream, output: EngineCoreOutput, engine_time: float, now: float) -> None:
        if output.new_token_ids:
            if self.metrics is not None:
                self.metrics.observe_tokens(stream, now)
            if stream.first_token_api_time is None:
                stream.first_token_api_time = now
            stream.last_token_api_time = now
            stream.num_output_tokens += len(output.new_token_ids)
        if output.finish_reason is not None:
            stream.finished = True
            if self.metrics is not None and output.finish_reason != "abort":
                self.metrics.observe_finished(stream, output.timing, output.finish_reason)
        stream.queue.put_nowait((output, engine_time))
