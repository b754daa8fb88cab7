"""A short machine-speed calibration recorded with every `bench sweep` run (config.json `calibration`).

`bench gate` compares the `speed` figures of its two runs and says so when they differ by more than its
threshold: a verdict between a fast and a slow state of a machine (another runner type, a throttled CPU, a
busy neighbour) measures the machine, not the code. The figures are fixed micro-benchmarks on the client's
machine, which on this project's CI is also the engine's: a float32 matrix multiply (numpy's BLAS, the kind
of work the CPU engine does) and a pure-Python loop (the kind of work the client and the server's Python
do). `client` holds the load generator's own timing error against the mock server's programmed timing
(`bench lab calibrate`, one stream).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

MATMUL_SIZE = 256


def cpu_speed(seconds: float = 0.3) -> dict[str, float]:
    """{"cpu_matmul_gflops", "python_loop_mops"}: the median of several timed slices of each, higher is faster."""
    a = np.random.default_rng(0).standard_normal((MATMUL_SIZE, MATMUL_SIZE)).astype(np.float32)
    flops = 2 * MATMUL_SIZE**3
    rates = []
    deadline = time.perf_counter() + seconds / 2
    while time.perf_counter() < deadline or len(rates) < 5:
        start = time.perf_counter()
        for _ in range(4):
            a @ a
        rates.append(4 * flops / (time.perf_counter() - start) / 1e9)
    loops = []
    deadline = time.perf_counter() + seconds / 2
    while time.perf_counter() < deadline or len(loops) < 5:
        start = time.perf_counter()
        total = 0
        for i in range(20_000):
            total += i & 7
        loops.append(20_000 / (time.perf_counter() - start) / 1e6)
    return {"cpu_matmul_gflops": float(np.median(rates)), "python_loop_mops": float(np.median(loops))}


def client_timing_error(num_prompts: int = 8) -> dict[str, float | None]:
    """The client's TTFT and TPOT error (ms, median) against a mock programmed for 20 ms TTFT and 5 ms gaps."""
    from sweep.mock.calibrate import measure, start_mock, summarize
    from sweep.point.client import ClientConfig

    ttft_ms, itl_ms = 20.0, 5.0
    log = Path(tempfile.mkdtemp(prefix="servelab-speed-")) / "mock.log"
    with start_mock(ttft_ms, itl_ms, log) as mock:
        client = ClientConfig(url=mock.url, model="mock")
        records, duration, cpu_s = measure(client, 1, num_prompts, 16, 1, (ttft_ms + itl_ms) / 1000.0)
    summary = summarize(records, duration, ttft_ms, itl_ms, cpu_s, None)
    return {key: summary[key] for key in ("ttft_error_p50_ms", "tpot_error_p50_ms")}


def machine_calibration(client: bool = True) -> dict[str, Any]:
    """What config.json records: `speed` (compared by the gate), and the client's timing error."""
    out: dict[str, Any] = {"speed": cpu_speed()}
    if client:
        out["client"] = client_timing_error()
    return out
