"""A stream that stalls, or a request that runs past its timeout, is a failed request with its reason, and the
sweep finishes instead of hanging (`bench sweep --stall-timeout/--request-timeout`,
`bench lab mock-server --hang-after-tokens`)."""

from __future__ import annotations

import asyncio
import json
import shlex
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import sweep.commands
from sweep.mock.server import MockConfig
from sweep.point.client import ClientConfig, PromptRequest, make_session, send_request
from sweep.point.records import RequestRecord
from sweep.run.launcher import ServerProcess, launch
from sweep.run.sweep_config import SweepConfig

HANG_AFTER = 2


@pytest.fixture(scope="module")
def hanging_mock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The mock through `bench lab mock-server`: every stream goes silent after HANG_AFTER tokens."""
    template = (f"{shlex.quote(sys.executable)} -m cli mock-server --port {{port}} --ttft-ms 1 --itl-ms 1 "
                f"--hang-after-tokens {HANG_AFTER}")  # fmt: skip
    log = tmp_path_factory.mktemp("mock") / "mock.log"
    with launch("mock", {}, log, template=template, health_timeout_s=60) as server:
        yield server


def _send(server: ServerProcess, stream_output: int, **timeouts: float | None) -> RequestRecord:
    async def one() -> RequestRecord:
        client = ClientConfig(url=server.url, model="mock", **timeouts)  # type: ignore[arg-type]
        async with make_session() as session:
            return await send_request(session, client, PromptRequest(0, "hello there", None, 2, stream_output))

    return asyncio.run(one())


def test_a_stalled_stream_fails_with_reason_stalled(hanging_mock: ServerProcess) -> None:
    record = _send(hanging_mock, 8, stall_timeout_s=0.3, request_timeout_s=None)
    assert not record.success and record.error is not None and record.error.startswith("Stalled")
    assert "--stall-timeout" in record.error
    assert len(record.chunk_times) == HANG_AFTER  # the tokens before the stall are kept


def test_a_request_past_its_timeout_fails_with_reason_timeout(hanging_mock: ServerProcess) -> None:
    record = _send(hanging_mock, 8, stall_timeout_s=None, request_timeout_s=0.3)
    assert not record.success and record.error is not None and record.error.startswith("Timeout")
    assert "--request-timeout" in record.error


def test_a_short_stream_is_not_cut(hanging_mock: ServerProcess) -> None:
    assert _send(hanging_mock, HANG_AFTER, stall_timeout_s=0.3, request_timeout_s=5).success


def test_timeouts_must_be_positive_or_off(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="stall_timeout_s"):
        ClientConfig(url="http://127.0.0.1:1/v1", model="m", stall_timeout_s=0)
    with pytest.raises(ValueError, match="--request-timeout must be >= 0"):
        SweepConfig(output_dir=tmp_path, request_timeout_s=-1)
    config = SweepConfig(output_dir=tmp_path, request_timeout_s=0, stall_timeout_s=0)
    assert (config.request_timeout_s, config.stall_timeout_s) == (None, None)  # 0: no limit
    with pytest.raises(ValueError, match="hang_after_tokens"):
        MockConfig(hang_after_tokens=-1)


def test_a_sweep_against_a_stalling_server_records_the_failures_and_finishes(
    hanging_mock: ServerProcess, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    app = typer.Typer()
    sweep.commands.register(app, {"lab": typer.Typer()})
    args = ["sweep", "--url", hanging_mock.url, "--model", "mock", "--tokenizer", "tiny-random", "--workload",
            "fixed", "--input-len", "8", "--output-len", "6", "--num-prompts", "3", "--concurrency", "2",
            "--no-calibration", "--stall-timeout", "0.3", "--request-timeout", "0",
            "--output-dir", str(out)]  # fmt: skip
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        done = CliRunner().invoke(app, args)
    finally:
        signal.signal(signal.SIGTERM, sigterm)  # the command turns SIGTERM into KeyboardInterrupt
    assert done.exit_code == 0, done.output
    stored = json.loads((out / "config.json").read_text())["sweep"]
    assert (stored["stall_timeout_s"], stored["request_timeout_s"]) == (0.3, None)  # 0 is stored as null
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(not r["success"] and r["error"].startswith("Stalled") for r in rows)
    point = json.loads((out / "points" / "c0002.json").read_text())
    assert (point["completed"], point["failed"]) == (0, 3)
