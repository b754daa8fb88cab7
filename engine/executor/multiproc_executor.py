"""The tensor-parallel executor: one worker process per rank (engine/executor/worker.py), driven from the
engine core's process, which schedules and samples and holds no model. The ranks are forked unless CUDA is
initialised here, then spawned (engine/executor/start_method.py), so a plain script needs no main guard.

Each step the driver flattens the SchedulerOutput into a ModelInput (token ids, positions, slots, block tables,
sample rows: no Request objects), pickles it once and writes the same bytes to every rank's pipe; rank 0 answers
with the gathered float32 logits. The ranks form a torch.distributed group (gloo on the CPU, NCCL on CUDA with
device r for rank r) for the all-reduces and the LM head's all-gather.

A rank that dies or fails makes every later call raise `EngineDeadError` naming the rank and its error, and the
remaining ranks are killed (they may be blocked in a collective with the dead one). `shutdown()` stops every
rank; it also runs when the executor is garbage-collected or the process exits.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import signal
import socket
import time
import weakref
from dataclasses import dataclass
from multiprocessing import BufferTooShort
from multiprocessing.connection import Connection, wait
from typing import Any, TypeVar

import numpy as np
import torch

from engine.config import ConfigError, EngineConfig
from engine.executor.start_method import GUARD, check_not_bootstrapping, worker_start_method
from engine.executor.worker import (
    DetermineNumBlocks,
    Done,
    Execute,
    InitializeKVCache,
    LogitsHeader,
    Ready,
    Shutdown,
    StepTimes,
    WorkerError,
    WorkerInfo,
    run_worker,
)
from engine.model_files import load_hf_config, resolve_model
from engine.model_input import prepare_model_input
from engine.models import ArchConfig
from engine.scheduler_output import SchedulerOutput

T = TypeVar("T")
logger = logging.getLogger(__name__)

_SHUTDOWN_TIMEOUT_S = 5.0
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class EngineDeadError(RuntimeError):
    """A tensor-parallel worker died or failed; the message names its rank and its error."""


@dataclass
class TensorParallelStats:
    """Totals over the executed steps: what the driver sent each rank, what rank 0 sent back, and rank 0's time
    in the forward pass and, within it, in collectives; `step_seconds` is the driver's round trip."""

    tensor_parallel_size: int
    num_steps: int = 0
    step_payload_bytes: int = 0
    logits_bytes: int = 0
    step_seconds: float = 0.0
    execute_seconds: float = 0.0
    collective_seconds: float = 0.0

    def per_step(self) -> dict[str, float]:
        """Means per step: payload and logits bytes, milliseconds of round trip, forward pass and collectives."""
        n = max(self.num_steps, 1)
        return {
            "step_payload_bytes": self.step_payload_bytes / n,
            "logits_bytes": self.logits_bytes / n,
            "step_ms": 1e3 * self.step_seconds / n,
            "execute_ms": 1e3 * self.execute_seconds / n,
            "collective_ms": 1e3 * self.collective_seconds / n,
        }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _describe_exit(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        return f"killed by {signal.Signals(-exitcode).name}"
    return f"exit code {exitcode}"


def _stop_workers(processes: list[Any], conns: list[Connection], graceful: bool) -> None:
    """Ask every live rank to exit (when `graceful`), then kill whatever is still running; close the pipes."""
    if graceful:
        for process, conn in zip(processes, conns, strict=True):
            if process.is_alive():
                try:
                    conn.send_bytes(pickle.dumps(Shutdown()))
                except OSError:
                    pass
        deadline = time.monotonic() + _SHUTDOWN_TIMEOUT_S
        for process in processes:
            process.join(timeout=max(deadline - time.monotonic(), 0.0))
    for process in processes:
        if process.is_alive():
            process.kill()
        process.join()
    for conn in conns:
        conn.close()


def _run_forked_worker(inherited: list[Connection], *args: Any) -> None:
    """A forked rank closes its copies of the earlier ranks' driver ends, so that each rank's pipe reaches EOF
    when the driver closes it, then runs the worker."""
    for conn in inherited:
        conn.close()
    run_worker(*args)


class MultiprocExecutor:
    """The Executor of `tensor_parallel_size` > 1 (engine/executor/__init__.py)."""

    def __init__(self, config: EngineConfig, ready_timeout_s: float = 1800.0) -> None:
        from engine.model_runner import resolve_device

        check_not_bootstrapping(f"the workers of tensor_parallel_size={config.parallel_config.tensor_parallel_size}")
        self.config = config
        mc, pc = config.model_config, config.parallel_config
        self.tensor_parallel_size = tp = pc.tensor_parallel_size
        self.arch = ArchConfig.from_hf(load_hf_config(resolve_model(mc.model)))
        worker_device = resolve_device(mc.device)
        if worker_device.type == "cuda" and tp > torch.cuda.device_count():
            raise ConfigError(
                f"tensor_parallel_size={tp} needs {tp} CUDA devices (one per rank); torch sees "
                f"{torch.cuda.device_count()}"
            )
        self.device = torch.device("cpu")  # where the logits arrive and the driver samples
        self.block_size = config.cache_config.block_size
        self.stats = TensorParallelStats(tp)
        self._dead: str | None = None
        self.start_method = worker_start_method()
        self._ready = False
        context = multiprocessing.get_context(self.start_method)
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        self._processes: list[Any] = []
        self._conns: list[Connection] = []
        self._finalizer = weakref.finalize(self, _stop_workers, self._processes, self._conns, True)
        for rank in range(tp):
            driver_end, worker_end = context.Pipe(duplex=True)
            worker_args = (rank, config, init_method, worker_end, os.getpid())
            forked = self.start_method == "fork"
            process = context.Process(
                target=_run_forked_worker if forked else run_worker,
                args=(list(self._conns), *worker_args) if forked else worker_args,
                name=f"servelab-tp-rank{rank}",
                daemon=True,
            )
            try:
                process.start()
            except BaseException:
                driver_end.close()
                self.shutdown()
                raise
            finally:
                worker_end.close()
            self._processes.append(process)
            self._conns.append(driver_end)
        try:
            infos: list[WorkerInfo] = [r.info for r in self._collect(Ready, range(tp), ready_timeout_s)]
        except BaseException:
            self.shutdown()
            raise
        self._ready = True
        info = infos[0]
        self.max_model_len: int = info.max_model_len
        self.eos_token_ids: list[int] = info.eos_token_ids
        self.vocab_size: int = info.vocab_size
        self.dtype = _DTYPES[info.dtype]
        self.forward_mode: str = info.forward_mode  # rank 0's; every rank compiles its own forward
        logger.info(
            "tensor_parallel_size=%d: %d %s worker processes on %s (%s, %d torch threads each; forward %s)", tp, tp,
            "forked" if self.start_method == "fork" else "spawned", info.device,
            "nccl" if worker_device.type == "cuda" else "gloo", info.num_threads, info.forward_mode,
        )  # fmt: skip

    # ------------------------------------------------------------------------------------------- the Executor

    def determine_num_blocks(self, extra_block_bytes: int = 0) -> int:
        """Every rank sizes its own KV cache of its KV heads; the pool is the smallest rank's. Every rank pays the
        whole `extra_block_bytes` per block (the draft model runs unsharded, in this process, on rank 0's device)."""
        self._broadcast(pickle.dumps(DetermineNumBlocks(extra_block_bytes)))
        per_rank = [r.value for r in self._collect(Done, range(self.tensor_parallel_size))]
        num_blocks = min(per_rank)
        logger.info(
            "KV cache: %d blocks of %d tokens per rank, %d ranks (each rank's own sizing: %s)",
            num_blocks, self.block_size, self.tensor_parallel_size, ", ".join(map(str, per_rank)),
        )  # fmt: skip
        return num_blocks

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self._broadcast(pickle.dumps(InitializeKVCache(num_blocks)))
        self._collect(Done, range(self.tensor_parallel_size))

    def execute_model(self, scheduler_output: SchedulerOutput) -> torch.Tensor:
        """The step runs on every rank; rank 0's gathered logits, float32 on the CPU."""
        start = time.perf_counter()
        payload = pickle.dumps(Execute(prepare_model_input(scheduler_output, self.block_size)), protocol=5)
        self._broadcast(payload)
        shape, times = self._wait_for_logits()
        logits = np.empty(shape, dtype=np.float32)
        self._receive_into(logits.reshape(-1).view(np.uint8))  # a flat byte view: recv_bytes_into counts items
        stats = self.stats
        stats.num_steps += 1
        stats.step_payload_bytes += len(payload)
        stats.logits_bytes += logits.nbytes
        stats.execute_seconds += times.execute_seconds
        stats.collective_seconds += times.collective_seconds
        stats.step_seconds += time.perf_counter() - start
        return torch.from_numpy(logits)

    def check_health(self) -> None:
        """Raise EngineDeadError if any rank has died."""
        self._check_alive()

    def shutdown(self) -> None:
        """Stop every rank (idempotent)."""
        self._finalizer()

    # ------------------------------------------------------------------------------------------- messaging

    def _fail(self, message: str) -> EngineDeadError:
        """Mark the executor dead, kill every rank, and return the error to raise."""
        self._dead = message
        self._finalizer.detach()
        _stop_workers(self._processes, self._conns, graceful=False)
        logger.error("%s", message)
        return EngineDeadError(message)

    def _died(self, rank: int) -> EngineDeadError:
        process = self._processes[rank]
        process.join(timeout=1.0)
        hint = ""
        if not self._ready and self.start_method == "spawn":  # its own stderr says why; the usual cause:
            hint = f"; a spawned rank imports the main module again: is the script's engine under `{GUARD}`?"
        return self._fail(
            f"tensor-parallel worker rank {rank} (pid {process.pid}) died: {_describe_exit(process.exitcode)}{hint}"
        )

    def _error(self, rank: int, error: str) -> EngineDeadError:
        """Rank `rank` failed with `error`; a peer killed by a signal is the cause (the collectives lost it)."""
        for peer, process in enumerate(self._processes):
            if peer != rank and process.exitcode is not None and process.exitcode < 0:
                return self._died(peer)
        return self._fail(f"tensor-parallel worker rank {rank} failed: {error}")

    def _check_alive(self) -> None:
        if self._dead is not None:
            raise EngineDeadError(self._dead)
        for rank, process in enumerate(self._processes):
            if not process.is_alive():
                raise self._died(rank)

    def _broadcast(self, payload: bytes) -> None:
        self._check_alive()
        for rank, conn in enumerate(self._conns):
            try:
                conn.send_bytes(payload)
            except OSError as error:
                raise self._fail(f"tensor-parallel worker rank {rank} is unreachable: {error}") from error

    def _receive(self, rank: int) -> object:
        try:
            message = pickle.loads(self._conns[rank].recv_bytes())
        except (EOFError, OSError):
            raise self._died(rank) from None
        if isinstance(message, WorkerError):
            raise self._error(message.rank, message.message)
        return message

    def _receive_into(self, buffer: np.ndarray) -> None:
        """Rank 0's raw logits bytes into `buffer`; a message of another size is its error (or garbage)."""
        try:
            self._conns[0].recv_bytes_into(buffer)
            return
        except BufferTooShort as short:
            received = short.args[0]
        except (EOFError, OSError):
            raise self._died(0) from None
        try:
            message = pickle.loads(received)
        except Exception:  # noqa: BLE001 - not a message at all
            message = None
        if isinstance(message, WorkerError):
            raise self._error(message.rank, message.message)
        raise self._fail(
            f"tensor-parallel worker rank 0 sent {len(received)} bytes of logits, expected {buffer.nbytes}"
        )

    def _wait(self, pending: set[int], timeout_s: float | None) -> list[int]:
        """Ranks in `pending` with a message (or EOF); raises EngineDeadError when a rank exits first."""
        sentinels = {process.sentinel: rank for rank, process in enumerate(self._processes)}
        conns = {self._conns[rank]: rank for rank in pending}
        ready = wait([*conns, *sentinels], timeout=timeout_s)
        if not ready:
            raise self._fail(f"tensor-parallel workers {sorted(pending)} did not answer within {timeout_s:.0f} s")
        with_message = [conns[r] for r in ready if r in conns]
        if with_message:
            return with_message
        rank = min(sentinels[r] for r in ready)
        if self._conns[rank].poll():
            self._receive(rank)  # its last word, sent outside `pending`: its error
        raise self._died(rank)

    def _collect(self, kind: type[T], ranks: range, timeout_s: float | None = None) -> list[T]:
        """One `kind` message from each rank, in rank order."""
        results: dict[int, T] = {}
        pending = set(ranks)
        while pending:
            for rank in self._wait(pending, timeout_s):
                message = self._receive(rank)
                if not isinstance(message, kind):
                    raise self._fail(
                        f"tensor-parallel worker rank {rank} sent {type(message).__name__}, expected {kind.__name__}"
                    )
                results[rank] = message
                pending.discard(rank)
        return [results[rank] for rank in ranks]

    def _wait_for_logits(self) -> tuple[tuple[int, ...], StepTimes]:
        """Rank 0's logits header; any other rank's message during a step is its error."""
        while True:
            for rank in self._wait(set(range(self.tensor_parallel_size)), None):
                message = self._receive(rank)
                if rank == 0 and isinstance(message, LogitsHeader):
                    return message.shape, message.times
                raise self._fail(f"tensor-parallel worker rank {rank} sent {type(message).__name__} during a step")
