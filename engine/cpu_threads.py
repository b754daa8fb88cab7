"""How the engine's CPU threads wait: OpenMP's passive wait policy by default under `bench`.

torch runs its CPU ops on an OpenMP team of one thread per core. With the default (active) policy a thread
that finishes its share of a parallel region spins until the others finish. When the engine shares the cores
with anything else (the load generator of `bench sweep`, the HTTP server's tokenisation, other jobs), a
spinning thread burns the time slice the thread it waits for needs, and the parallel regions of a step
(hundreds) each wait for a descheduled thread: on 2 oversubscribed cores the engine collapses (`bench
omp-wait-policy`, docs/BENCHMARKS.md). Passive threads sleep instead, at the cost of a wake-up per region.

The OpenMP runtime reads OMP_WAIT_POLICY once, when torch loads it, so `bench` sets the default before any
command imports torch; an OMP_WAIT_POLICY already in the environment wins (export OMP_WAIT_POLICY=ACTIVE for
a machine the engine has to itself). Processes `bench` launches (`bench sweep`'s server) inherit it.
Library users of `engine.LLM` set it themselves before importing torch.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

DEFAULT_OMP_WAIT_POLICY = "PASSIVE"


def set_default_omp_wait_policy(environ: MutableMapping[str, str] = os.environ) -> str:
    """Set OMP_WAIT_POLICY to PASSIVE unless it is set; returns the policy in effect."""
    return environ.setdefault("OMP_WAIT_POLICY", DEFAULT_OMP_WAIT_POLICY)
