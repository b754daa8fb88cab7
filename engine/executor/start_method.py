"""How the engine starts its tensor-parallel worker processes: vLLM's rule, `fork` unless CUDA is initialised.

`fork` needs nothing from the caller's script: the child is a copy of this process and runs the worker from there,
so `LLM(model, tensor_parallel_size=2)` works in a plain script with no `if __name__ == "__main__":` guard. A
process that has initialised CUDA cannot fork a child that uses CUDA, so there the workers are spawned (with a
warning, as vLLM warns): a spawned child imports the parent's main module again before it runs anything, and the
script's engine must then sit under the guard. A script without one would build its engine again inside that
import; `check_not_bootstrapping` stops it there with an error that names the guard, before multiprocessing's own
bootstrap error can.

Fork and threads: the child keeps only the forking thread. torch's intra-op pool (OpenMP) is rebuilt in the
child at its first parallel region, at the size the worker sets (tests/engine/executor/test_start_method.py runs a
forked pair after the parent's own multi-threaded forward passes and checks it finishes).
"""

from __future__ import annotations

import logging
import multiprocessing
import sys

import torch

logger = logging.getLogger(__name__)

GUARD = 'if __name__ == "__main__":'


def worker_start_method() -> str:
    """`fork` on Linux while this process has not initialised CUDA, else `spawn` (with a warning naming why)."""
    if not sys.platform.startswith("linux"):
        return "spawn"
    if torch.cuda.is_initialized():
        logger.warning(
            "CUDA is initialised in this process, so the tensor-parallel workers are spawned, not forked: each "
            "imports your main module again; keep the code that builds the engine under `%s`", GUARD,
        )  # fmt: skip
        return "spawn"
    return "fork"


def check_not_bootstrapping(what: str) -> None:
    """Raise at once when this process is a spawned child still importing its parent's main module (a script
    without the guard that builds an engine at import), naming the guard; `what` is what it was about to start."""
    # multiprocessing's own check (spawn._check_not_importing_main) reads the same flag, set only while the
    # child prepares: imports the parent's main module before running its target.
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise RuntimeError(
            f"cannot start {what} while this spawned process is still importing its parent's main module: the "
            f"script builds its engine at import. Put that code under `{GUARD}` (a spawned process imports its "
            "parent's main module again before it runs)"
        )
