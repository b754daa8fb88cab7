"""`bench lab calibrate`: how much the client itself adds, measured against the mock server's known timing.

For each concurrency: start the mock (programmed TTFT and inter-token gap), open keep-alive connections with
one warm-up wave, then run closed-loop requests and compare measured TTFT and TPOT with the programmed values
(the error is what the client, the loopback and the shared CPU add). With `max_rate`, a second mock streams
with a zero gap, and the chunks/s the client receives at the highest concurrency is its ceiling (a lower
bound: the mock shares the CPU).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sweep.point.benchmark_metrics import request_tpot
from sweep.point.client import ClientConfig, PromptRequest, count_tokens, make_session
from sweep.point.records import RequestRecord
from sweep.point.runner import PointSpec, dispatch
from sweep.run.launcher import ServerProcess, free_port


@dataclass
class CalibrateConfig:
    concurrencies: list[int]
    output_len: int = 64
    num_prompts: int | None = None  # default: 4 x concurrency, at least 16
    ttft_ms: float = 50.0
    itl_ms: float = 10.0
    client_procs: int = 1
    endpoint: str = "completions"
    max_rate: bool = True
    mock_workers: int = 1

    def __post_init__(self) -> None:
        if not self.concurrencies or any(c < 1 for c in self.concurrencies):
            raise ValueError(f"concurrencies must be positive, got {self.concurrencies}")
        if self.output_len < 2:
            raise ValueError("output_len must be >= 2 so TPOT is defined")

    def prompts_for(self, concurrency: int) -> int:
        return self.num_prompts or max(16, 4 * concurrency)


def start_mock(ttft_ms: float, itl_ms: float, log_path: Path, workers: int = 1) -> ServerProcess:
    port = free_port()
    command = [sys.executable, "-m", "sweep.mock.server", "--port", str(port), "--ttft-ms", str(ttft_ms)]
    command += ["--itl-ms", str(itl_ms), "--workers", str(workers)]
    return ServerProcess(command=command, host="127.0.0.1", port=port, log_path=log_path, health_timeout_s=60)


def _prompts(n: int, output_len: int) -> list[PromptRequest]:
    """Output lengths spread over 0.5x..1.5x, so closed-loop requests finish, and get replaced, one at a time
    rather than in synchronised waves (a wave of simultaneous sends measures the burst, not the client)."""
    lengths = [max(2, round(output_len * (0.5 + (i % 11) / 10))) for i in range(n)]
    return [PromptRequest(i, "hello " * 8, None, 8, length) for i, length in enumerate(lengths)]


def ramp_offsets(n: int, concurrency: int, ramp_s: float) -> list[float]:
    """Closed loop with the first `concurrency` sends spread evenly over `ramp_s`; the rest are due at the ramp's
    end, so they wait for a free slot. Without a ramp every stream starts (and then emits) in phase with every
    other, and the point measures one synchronised burst after another instead of the client."""
    return [min(i, concurrency - 1) * ramp_s / concurrency for i in range(n)]


async def _closed_loop(
    client: ClientConfig, concurrency: int, n: int, output_len: int, ramp_s: float
) -> tuple[list, float, float]:
    async with make_session() as session:
        warm = _prompts(concurrency, 2)  # one wave to open every keep-alive connection
        await dispatch(session, client, warm, [0.0] * len(warm), time.perf_counter(), concurrency, None)
        prompts = _prompts(n, output_len)
        t0 = time.perf_counter() + 0.05
        cpu_start = time.process_time()
        records = await dispatch(session, client, prompts, ramp_offsets(n, concurrency, ramp_s), t0, concurrency, None)
        cpu_s = time.process_time() - cpu_start
    return records, t0, cpu_s


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of another process (Linux /proc), None where unavailable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def measure(
    client: ClientConfig, concurrency: int, n: int, output_len: int, procs: int, ramp_s: float = 0.0
) -> tuple[list, float, float]:
    """Closed-loop records at `concurrency`, the point's duration and the client's CPU seconds (all processes)."""
    if procs == 1:
        records, t0, cpu_s = asyncio.run(_closed_loop(client, concurrency, n, output_len, ramp_s))
        duration = max(r.end_time for r in records) - t0
    else:
        from sweep.point.multiproc import run_point_sharded

        spec = PointSpec(label="calibrate", mode="concurrency", concurrency=concurrency, num_prompts=n)
        warm = _prompts(concurrency, 2)
        records, _, duration, extras = run_point_sharded(
            client, spec, _prompts(n, output_len), ramp_offsets(n, concurrency, ramp_s), warm, False, procs, None
        )
        cpu_s = extras["client_cpu_s"]
    count_tokens(records, None, {})
    return records, duration, cpu_s


def summarize(
    records: list[RequestRecord], duration: float, ttft_ms: float, itl_ms: float, cpu_s: float, mock_cpu_s: float | None
) -> dict[str, Any]:
    """Errors against the programmed timing, and where the CPU went: `client_cpu_cores` near the number of client
    processes means the client is the bottleneck; well below it (with a low chunk rate) means the machine is."""
    ok = [r for r in records if r.success]
    ttft_err = np.asarray([r.ttft for r in ok], dtype=float) * 1000 - ttft_ms
    tpot_err = np.asarray([request_tpot(r) for r in ok], dtype=float) * 1000 - itl_ms
    chunks = sum(len(r.chunk_times) for r in ok)
    return {
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "ttft_error_p50_ms": float(np.median(ttft_err)) if ok else None,
        "ttft_error_p99_ms": float(np.percentile(ttft_err, 99)) if ok else None,
        "tpot_error_p50_ms": float(np.median(tpot_err)) if ok else None,
        "tpot_error_p99_ms": float(np.percentile(tpot_err, 99)) if ok else None,
        "chunks_per_s": chunks / duration if duration > 0 else None,
        "client_cpu_cores": cpu_s / duration if duration > 0 else None,
        "mock_cpu_cores": mock_cpu_s / duration if duration > 0 and mock_cpu_s is not None else None,
        "chunks_per_client_cpu_s": chunks / cpu_s if cpu_s > 0 else None,
    }


def run_calibration(config: CalibrateConfig, output_json: Path | None = None) -> dict[str, Any]:
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True)
    logs = Path(tempfile.mkdtemp(prefix="servelab-calibrate-"))
    report: dict[str, Any] = {"config": config.__dict__, "timed": {}, "max_rate": None}
    with start_mock(config.ttft_ms, config.itl_ms, logs / "mock.log", config.mock_workers) as mock:
        client = ClientConfig(url=mock.url, model="mock", endpoint=config.endpoint)
        for c in config.concurrencies:
            with console.status(f"concurrency {c}: {config.prompts_for(c)} requests"):
                ramp_s = (config.ttft_ms + config.itl_ms) / 1000.0
                mock_cpu = process_cpu_s(mock.process.pid)  # type: ignore[union-attr]
                records, duration, cpu_s = measure(
                    client, c, config.prompts_for(c), config.output_len, config.client_procs, ramp_s
                )
                mock_cpu = _delta(process_cpu_s(mock.process.pid), mock_cpu)  # type: ignore[union-attr]
            report["timed"][c] = summarize(records, duration, config.ttft_ms, config.itl_ms, cpu_s, mock_cpu)
    if config.max_rate:
        c = max(config.concurrencies)
        with start_mock(0.0, 0.0, logs / "mock-max.log", config.mock_workers) as mock:
            client = ClientConfig(url=mock.url, model="mock", endpoint=config.endpoint)
            with console.status(f"maximum chunk rate at concurrency {c}"):
                mock_cpu = process_cpu_s(mock.process.pid)  # type: ignore[union-attr]
                records, duration, cpu_s = measure(client, c, config.prompts_for(c), 256, config.client_procs)
                mock_cpu = _delta(process_cpu_s(mock.process.pid), mock_cpu)  # type: ignore[union-attr]
            report["max_rate"] = {"concurrency": c, **summarize(records, duration, 0.0, 0.0, cpu_s, mock_cpu)}
    table = Table(
        title=f"client calibration: TTFT {config.ttft_ms} ms, gap {config.itl_ms} ms, procs {config.client_procs}"
    )
    for column in (
        "concurrency",
        "done",
        "fail",
        "TTFT err p50",
        "TTFT err p99",
        "TPOT err p50",
        "TPOT err p99",
        "chunks/s",
        "client CPU",
        "chunks/CPU-s",
    ):
        table.add_column(column, justify="right")
    for c, s in report["timed"].items():
        table.add_row(
            str(c),
            str(s["completed"]),
            str(s["failed"]),
            *(f"{s[k]:.2f}" if s[k] is not None else "-" for k in _ERROR_KEYS),
            f"{s['chunks_per_s']:.0f}",
            f"{s['client_cpu_cores']:.2f}",
            f"{s['chunks_per_client_cpu_s']:.0f}",
        )
    console.print(table)
    if report["max_rate"]:
        m = report["max_rate"]
        console.print(
            f"maximum streamed chunks/s at concurrency {m['concurrency']} (zero gap): {m['chunks_per_s']:.0f} "
            f"with {m['client_cpu_cores']:.2f} client CPU cores busy ({m['chunks_per_client_cpu_s']:.0f} chunks per "
            f"client CPU-second; mock {m['mock_cpu_cores'] or 0:.2f} cores)"
        )
    console.print(f"[dim]mock logs: {logs}[/dim]")
    if output_json is not None:
        output_json.parent.mkdir(parents=True, exist_ok=True)
        output_json.write_text(json.dumps(report, indent=2))
    return report


def _delta(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else after - before


_ERROR_KEYS = ("ttft_error_p50_ms", "ttft_error_p99_ms", "tpot_error_p50_ms", "tpot_error_p99_ms")
