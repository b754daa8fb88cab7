"""One tensor-parallel rank: a forked (or spawned) process that joins the torch.distributed group, builds its
shard of the model in a ModelRunner and runs the steps the driver sends it.

Every message is one pickled tuple over the rank's own pipe (multiprocessing Connection, `send_bytes`).

Driver → worker: ("determine_num_blocks", extra_block_bytes) | ("initialize_kv_cache", num_blocks)
                 | ("execute", ModelInput) | ("shutdown",)
Worker → driver: ("ready", WorkerInfo) once loaded; ("ok", result) for determine_num_blocks and
                 initialize_kv_cache from every rank; for execute only rank 0 answers, with
                 ("logits", shape, StepTimes) followed by the float32 logits as raw bytes;
                 ("error", rank, message) from any rank that fails, which then exits.

A worker ignores SIGINT (the driver owns shutdown: Ctrl-C reaches the whole process group) and exits on its own
when the driver goes away: its pipe reaches EOF between steps, and a watcher thread notices a new parent process
(the driver was killed) even while the rank waits in a collective.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from engine.config import EngineConfig

_PARENT_POLL_S = 0.5


@dataclass
class WorkerInfo:
    """What rank 0 reports once its shard is loaded."""

    max_model_len: int
    eos_token_ids: list[int]
    vocab_size: int
    dtype: str
    device: str
    num_threads: int
    forward_mode: str  # the rank's ModelRunner.forward_mode: "compiled in 8.7 s" or "eager (reason)"


@dataclass
class StepTimes:
    """Rank 0's seconds for one step: the whole forward pass, and the part of it spent in collectives."""

    execute_seconds: float
    collective_seconds: float


# Driver → worker messages.
@dataclass
class Execute:
    model_input: Any  # engine.model_input.ModelInput


@dataclass
class DetermineNumBlocks:
    extra_block_bytes: int


@dataclass
class InitializeKVCache:
    num_blocks: int


@dataclass
class Shutdown:
    pass


# Worker → driver messages.
@dataclass
class Ready:
    info: WorkerInfo


@dataclass
class Done:
    """The answer to DetermineNumBlocks (the block count) or InitializeKVCache (None)."""

    value: Any


@dataclass
class LogitsHeader:
    """Rank 0's answer to Execute; the raw float32 logits bytes follow it on the pipe."""

    shape: tuple[int, ...]
    times: StepTimes


@dataclass
class WorkerError:
    rank: int
    message: str


def default_num_threads(tensor_parallel_size: int) -> int:
    """Each rank's share of the cores this process may run on (at least one)."""
    return max(1, len(os.sched_getaffinity(0)) // tensor_parallel_size)


def _exit_when_orphaned(parent_pid: int) -> None:
    while True:
        time.sleep(_PARENT_POLL_S)
        if os.getppid() != parent_pid:
            os._exit(1)


def _send(conn: Connection, message: object) -> None:
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def run_worker(rank: int, config: EngineConfig, init_method: str, conn: Connection, parent_pid: int) -> None:
    """Process target of rank `rank`; returns (and the process exits) on shutdown, EOF or an error."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watcher = threading.Thread(target=_exit_when_orphaned, args=(parent_pid,), name="servelab-tp-parent", daemon=True)
    watcher.start()
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s %(levelname)s rank{rank} %(name)s: %(message)s")
    try:
        runner = _load(rank, config, init_method)
        info = WorkerInfo(
            max_model_len=runner.max_model_len,
            eos_token_ids=list(runner.eos_token_ids),
            vocab_size=runner.vocab_size,
            dtype=str(runner.dtype).removeprefix("torch."),
            device=str(runner.device),
            num_threads=_num_threads(),
            forward_mode=runner.forward_mode,
        )
        _send(conn, Ready(info))
        _serve(rank, runner, conn)
    except EOFError:
        return
    except BaseException as error:  # noqa: BLE001 - every failure goes to the driver with this rank's traceback
        message = f"{type(error).__name__}: {error}\n{traceback.format_exc()}"
        try:
            _send(conn, WorkerError(rank, message))
        except OSError:
            pass
        os._exit(1)  # peers may be blocked in a collective with this rank: do not run exit handlers that wait
    finally:
        from engine.distributed import destroy_model_parallel

        destroy_model_parallel()


def _num_threads() -> int:
    import torch

    return torch.get_num_threads()


def _load(rank: int, config: EngineConfig, init_method: str) -> Any:
    import torch

    from engine.distributed import init_distributed_environment, initialize_model_parallel
    from engine.model_runner import ModelRunner, resolve_device

    pc = config.parallel_config
    tp_size = pc.tensor_parallel_size
    device = resolve_device(config.model_config.device)
    if device.type == "cuda":
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(pc.cpu_threads or default_num_threads(tp_size))
    backend = "nccl" if device.type == "cuda" else "gloo"
    init_distributed_environment(tp_size, rank, init_method, backend=backend)
    initialize_model_parallel(tp_size)
    return ModelRunner(config)


def _serve(rank: int, runner: Any, conn: Connection) -> None:
    from engine.distributed import pop_collective_seconds

    while True:
        message = pickle.loads(conn.recv_bytes())
        if isinstance(message, Execute):
            pop_collective_seconds()
            start = time.perf_counter()
            logits = runner.execute_model_input(message.model_input)
            if rank == 0:
                array = logits.cpu().numpy()
                times = StepTimes(time.perf_counter() - start, pop_collective_seconds())
                _send(conn, LogitsHeader(array.shape, times))
                conn.send_bytes(array if array.size else b"")  # a step without sample rows sends no bytes
        elif isinstance(message, DetermineNumBlocks):
            _send(conn, Done(runner.determine_num_blocks(message.extra_block_bytes)))
        elif isinstance(message, InitializeKVCache):
            runner.initialize_kv_cache(message.num_blocks)
            _send(conn, Done(None))
        elif isinstance(message, Shutdown):
            return
        else:
            raise ValueError(f"unknown worker message {type(message).__name__}")
