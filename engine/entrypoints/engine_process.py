"""The engine process: EngineCore's busy loop behind two multiprocessing queues (token ids only, no text).

Messages in (API → engine):   AddRequest | AbortRequests | UtilityCall | Shutdown
Messages out (engine → API):  Ready | StartupFailed | Outputs | RequestError | UtilityResult
Every forwarded output carries a snapshot of its request's RequestTiming (the core fills it in place), so the
API process can report engine-side timing even for requests it ends itself (stop strings, disconnects).
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import multiprocessing
import os
import queue
import signal
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.config import EngineConfig
from engine.outputs import EngineCoreOutput, SchedulerStats
from engine.request import Request

if TYPE_CHECKING:
    from engine.engine_core import EngineCore

_PARENT_CHECK_INTERVAL_S = 1.0
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


@dataclass
class EngineInfo:
    """What the API process needs to know about the loaded engine."""

    model: str
    max_model_len: int
    vocab_size: int
    eos_token_ids: list[int]
    num_gpu_blocks: int
    block_size: int
    # Engine clock → Unix time: epoch_seconds = engine_monotonic + epoch_offset (measured in the engine process).
    epoch_offset: float
    tensor_parallel_size: int = 1  # num_gpu_blocks is per rank: each rank's cache holds its KV heads of every block
    forward_mode: str = "eager"  # EngineCore.forward_mode: "compiled in 8.7 s" or "eager (reason)"

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size


def _engine_info(core: EngineCore, config: EngineConfig) -> EngineInfo:
    return EngineInfo(
        model=config.model_config.model,
        max_model_len=core.max_model_len,
        vocab_size=core.vocab_size,
        eos_token_ids=list(core.eos_token_ids),
        num_gpu_blocks=core.num_gpu_blocks,
        block_size=config.cache_config.block_size,
        epoch_offset=time.time() - time.monotonic(),
        tensor_parallel_size=config.parallel_config.tensor_parallel_size,
        forward_mode=core.forward_mode,
    )


# API → engine messages.
@dataclass
class AddRequest:
    request: Request


@dataclass
class AbortRequests:
    request_ids: list[str]


@dataclass
class UtilityCall:
    """Call EngineCore.<name>() and answer with a UtilityResult of the same call_id."""

    call_id: int
    name: str


@dataclass
class Shutdown:
    pass


# Engine → API messages.
@dataclass
class Ready:
    info: EngineInfo


@dataclass
class StartupFailed:
    message: str


@dataclass
class Outputs:
    """One step's outputs (possibly none), the scheduler's stats after it, and the engine clock when it ended."""

    outputs: list[EngineCoreOutput]
    stats: SchedulerStats
    engine_time: float


@dataclass
class RequestError:
    request_id: str
    message: str


@dataclass
class UtilityResult:
    call_id: int
    result: Any  # the call's return value, or the exception it raised


def run_engine_core(config: EngineConfig, input_queue: Any, output_queue: Any, log_level: int = logging.INFO) -> None:
    """Process target. Ctrl-C (and `kill` of the process group) reaches this process too, but the API process owns
    shutdown: it drains in-flight requests first, then sends Shutdown (or kills this process). If the API process
    dies instead, the busy loop notices and exits."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent()
    # A spawned process starts with bare logging: show the engine's own lines (KV blocks, load progress) too.
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        from engine.engine_core import EngineCore

        core = EngineCore(config)
        info = _engine_info(core, core.config)
    except Exception as error:  # noqa: BLE001 - any load failure is reported to the parent verbatim
        output_queue.put(StartupFailed(f"{type(error).__name__}: {error}"))
        return
    output_queue.put(Ready(info))
    _busy_loop(core, input_queue, output_queue)


def _die_with_parent() -> None:
    """Linux: the kernel SIGKILLs this process when the API process dies, wherever this process is (loading the
    model, waiting for tensor-parallel ranks); the busy loop's own parent check covers only the loop. The API
    process starts the engine from its main thread, which lives as long as it does (the signal follows the
    thread that started the child)."""
    parent = multiprocessing.parent_process()
    if parent is None or not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent.pid:  # the API process died before prctl took effect
        os._exit(1)


def _busy_loop(core: EngineCore, input_queue: Any, output_queue: Any) -> None:
    parent = multiprocessing.parent_process()
    requests: dict[str, Request] = {}
    last_parent_check = time.monotonic()
    while True:
        busy = core.has_unfinished_requests()
        messages = []
        try:
            if not busy:
                messages.append(input_queue.get(timeout=_PARENT_CHECK_INTERVAL_S))
            while True:
                messages.append(input_queue.get_nowait())
        except queue.Empty:
            pass
        for message in messages:
            if isinstance(message, Shutdown):
                return
            _handle(core, message, requests, output_queue)
        if core.has_unfinished_requests():
            outputs = core.step()
            engine_time = time.monotonic()
            for output in outputs:
                request = requests.get(output.request_id)
                if request is not None:
                    if output.timing is None:
                        output.timing = dataclasses.replace(request.timing)
                    if output.finish_reason is not None:
                        del requests[output.request_id]
            output_queue.put(Outputs(outputs, core.get_stats(), engine_time))
        elif messages:  # aborts and resets change the gauges even when nothing runs
            output_queue.put(Outputs([], core.get_stats(), time.monotonic()))
        now = time.monotonic()
        if now - last_parent_check > _PARENT_CHECK_INTERVAL_S:
            last_parent_check = now
            if parent is not None and not parent.is_alive():
                return  # the API process died: never outlive it
            core.check_health()  # a dead tensor-parallel rank ends this process now, not at the next request


def _handle(core: EngineCore, message: object, requests: dict[str, Request], output_queue: Any) -> None:
    if isinstance(message, AddRequest):
        request = message.request
        request.timing.arrival_time = time.monotonic()  # engine clock; the API stamped its own clock
        try:
            core.add_request(request)
        except ValueError as error:
            output_queue.put(RequestError(request.request_id, str(error)))
            return
        requests[request.request_id] = request
    elif isinstance(message, AbortRequests):
        request_ids = [r for r in message.request_ids if r in requests]
        for request_id in request_ids:
            del requests[request_id]
        if request_ids:
            core.abort_requests(request_ids)
    elif isinstance(message, UtilityCall):
        try:
            result: Any = getattr(core, message.name)()
        except Exception as error:  # noqa: BLE001 - reported to the caller
            result = error
        output_queue.put(UtilityResult(message.call_id, result))
    else:
        raise ValueError(f"unknown engine message {type(message).__name__}")
