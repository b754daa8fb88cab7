"""A short machine-speed calibration recorded with every `bench sweep` run (config.json `calibration`).

`bench gate` compares the `speed` figures of its two runs and says so when they differ by more than its
threshold: a verdict between a fast and a slow state of a machine (another runner type, a throttled CPU, a
busy neighbour) measures the machine, not the code. The figures are fixed micro-benchmarks on the client's
machine, which on this project's CI is also the engine's: a float32 matrix multiply (numpy's BLAS, the kind
of work the CPU engine does) and a pure-Python loop (the kind of work the client and the server's Python
do). `client` holds the load generator's own timing error against the mock server's programmed timing
(`bench lab calibrate`, one stream). `host` says whether something else was running when the run began
(the load average, and the cores other processes kept busy while this one slept), and `host_warnings`
turns `host` and `speed` into the warning lines the console and the report print.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

MATMUL_SIZE = 256
# Below this the host is called slow: idle 2-core hosts of this project measured 126-502 GFLOP/s on this
# 256x256 float32 matmul, and 90 with one other process running.
SLOW_MATMUL_GFLOPS = 100.0
# Above this many cores kept busy by other processes (sampled while this one sleeps) the host is called busy.
BUSY_CORES = 0.5


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


def _cpu_jiffies() -> tuple[int, int] | None:
    """(busy, total) jiffies over all CPUs from /proc/stat, or None where there is no /proc (not Linux)."""
    try:
        fields = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def host_load(sample_s: float = 0.5) -> dict[str, float | int | None]:
    """The 1-minute load average, the core count, and the cores busy with other work while this process sleeps."""
    cpu_count = os.cpu_count() or 1
    load_1m = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    before = _cpu_jiffies()
    time.sleep(sample_s)
    after = _cpu_jiffies()
    busy_cores = None
    if before is not None and after is not None and after[1] > before[1]:
        busy_cores = round(cpu_count * (after[0] - before[0]) / (after[1] - before[1]), 2)
    return {"load_average_1m": load_1m, "cpu_count": cpu_count, "busy_cores": busy_cores}


def host_warnings(calibration: dict[str, Any] | None) -> list[str]:
    """Warning lines for a run's config.json `calibration`: the host was busy, or slower than these hosts idle."""
    calibration = calibration or {}
    host, speed = calibration.get("host") or {}, calibration.get("speed") or {}
    warnings = []
    busy = host.get("busy_cores")
    if busy is not None and busy > BUSY_CORES:
        warnings.append(
            f"host busy: other processes kept {busy:.2f} of {host.get('cpu_count')} cores busy when the run began "
            f"(1-minute load average {host.get('load_average_1m')}); its latencies include that contention"
        )
    gflops = speed.get("cpu_matmul_gflops")
    if gflops is not None and gflops < SLOW_MATMUL_GFLOPS:
        warnings.append(
            f"host slow: the machine-speed check measured {gflops:.0f} GFLOP/s, below {SLOW_MATMUL_GFLOPS:.0f} "
            "(these 2-core hosts measure 126-502 idle); compare its figures only with runs of the same host"
        )
    return warnings


def machine_calibration(client: bool = True) -> dict[str, Any]:
    """What config.json records: `host` (load as the run began), `speed` (the gate compares it), client error."""
    out: dict[str, Any] = {"host": host_load(), "speed": cpu_speed()}
    if client:
        out["client"] = client_timing_error()
    return out
