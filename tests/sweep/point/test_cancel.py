"""Cancellations under load (`bench sweep --cancel-rate/--cancel-after`): the flag's syntax, the seeded choice, the
client closing its connection mid-stream against the in-process mock (which must see it and stop generating),
and cancelled requests kept out of the latency figures, the failures and attainment's denominator."""

from __future__ import annotations

import asyncio
import time

import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

import sweep.commands
from reports.recompute import goodput
from sweep.mock.server import MockConfig, MockServer
from sweep.point.benchmark_metrics import calculate_metrics
from sweep.point.cancel import CancelAfter, CancelConfig, choose_cancelled, mark_cancellations, parse_cancel_after
from sweep.point.client import ClientConfig, PromptRequest, make_session, send_request
from sweep.point.records import RequestRecord

ITL_MS, OUTPUT_LEN = 10.0, 60  # a full stream takes ~0.6 s


def test_cancel_after_syntax() -> None:
    assert parse_cancel_after("2s") == CancelAfter(seconds=2.0)
    assert parse_cancel_after("500ms") == CancelAfter(seconds=0.5)
    assert parse_cancel_after("0.25s") == CancelAfter(seconds=0.25)
    assert parse_cancel_after("16tok") == CancelAfter(tokens=16)
    for bad in ("2", "2 min", "1.5tok", "0tok", "0s", "-1s", "tok", ""):
        with pytest.raises(ValueError, match="--cancel-after"):
            parse_cancel_after(bad)


def test_cancel_config_checks() -> None:
    for rate in (-0.1, 1.5):
        with pytest.raises(ValueError, match=r"--cancel-rate must be in \[0, 1\]"):
            CancelConfig(rate, CancelAfter(seconds=1.0))
    with pytest.raises(ValueError, match="needs --cancel-after"):
        CancelConfig(0.5)
    with pytest.raises(ValueError, match="needs a --cancel-rate"):
        CancelConfig(0.0, CancelAfter(tokens=4))


def test_the_choice_is_seeded_and_exact() -> None:
    chosen = choose_cancelled(200, 0.25, seed=3)
    assert len(chosen) == 50 and chosen == choose_cancelled(200, 0.25, seed=3)
    assert chosen != choose_cancelled(200, 0.25, seed=4)
    assert choose_cancelled(10, 0.0, 0) == set() and choose_cancelled(10, 1.0, 0) == set(range(10))
    prompts = [PromptRequest(i, "x", None, 1, 4) for i in range(8)]
    mark_cancellations(prompts, CancelConfig(0.5, CancelAfter(tokens=2)), seed=0)
    assert sum(p.cancel_after is not None for p in prompts) == 4


async def _against_mock(prompts: list[PromptRequest]) -> tuple[list[RequestRecord], MockServer, dict[str, float]]:
    mock = MockServer(MockConfig(ttft_ms=5.0, itl_ms=ITL_MS))
    server = await asyncio.get_running_loop().create_server(mock.protocol, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = ClientConfig(url=f"http://127.0.0.1:{port}/v1", model="mock")
    seen: dict[str, float] = {}
    async with server, make_session() as session:
        start = time.perf_counter()
        records = await asyncio.gather(*(send_request(session, client, p) for p in prompts))
        seen["cancelled_done_s"] = time.perf_counter() - start
        for _ in range(100):  # the server notices the closed connections within a few event-loop turns
            if mock.num_running == 0:
                break
            await asyncio.sleep(0.005)
        seen["running_after"] = mock.num_running
    return list(records), mock, seen


def test_cancelled_requests_are_recorded_and_the_mock_stops_generating() -> None:
    prompts = [PromptRequest(i, "a b c", None, 3, OUTPUT_LEN) for i in range(3)]
    prompts[0].cancel_after = CancelAfter(tokens=4)
    prompts[1].cancel_after = CancelAfter(seconds=0.1)
    prompts[2].cancel_after = None  # runs to the end
    records, mock, seen = asyncio.run(_against_mock(prompts[:2]))
    by_tokens, by_time = records
    assert by_tokens.cancelled and not by_tokens.success and by_tokens.error is None
    assert sum(by_tokens.chunk_tokens) == 4
    assert by_time.cancelled and not by_time.success and by_time.error is None
    assert 0 < len(by_time.chunk_times) < OUTPUT_LEN and by_time.end_time - by_time.send_time < 0.3  # type: ignore[operator]
    # the mock saw both disconnects and stopped: nothing runs on, no request ran to its 60 tokens
    assert mock.num_aborted == 2 and seen["running_after"] == 0
    assert mock.generation_tokens == 0 and seen["cancelled_done_s"] < 0.4
    (whole,), mock, _ = asyncio.run(_against_mock(prompts[2:]))
    assert whole.success and not whole.cancelled and mock.num_aborted == 0 and mock.generation_tokens == OUTPUT_LEN


def _record(index: int, ttft: float, *, cancelled: bool = False, success: bool = True) -> RequestRecord:
    chunks = [ttft, ttft + 0.01, ttft + 0.02]
    return RequestRecord(
        index, 8, 3, intended_send_time=0.0, send_time=0.0, success=success and not cancelled, cancelled=cancelled,
        error=None if success or cancelled else "HTTPStatus 500: x", first_token_time=chunks[0],
        last_token_time=chunks[-1], end_time=chunks[-1], chunk_times=chunks, chunk_tokens=[1, 1, 1],
        prompt_tokens=8, output_tokens=3,
    )


def test_cancelled_requests_are_neither_successes_nor_failures() -> None:
    # two good completions (TTFT 0.1 s), one failure, one cancelled request with a (huge) first token
    records = [_record(0, 0.1), _record(1, 0.1), _record(2, 0.1, success=False), _record(3, 9.0, cancelled=True)]
    m = calculate_metrics(records, 1.0, [50.0], {"ttft_ms": 500.0})
    assert (m["completed"], m["failed"], m["cancelled"]) == (2, 1, 1)
    assert m["p50_ttft_ms"] == pytest.approx(100.0) and m["mean_ttft_ms"] == pytest.approx(100.0)
    assert m["slo_attainment"] == pytest.approx(2 / 3)  # the cancelled request is out of the denominator
    assert m["total_output_tokens"] == 6
    rows = pd.DataFrame([r.to_row("c0001") for r in records])
    assert goodput(rows, 1.0, {"ttft_ms": 500.0})[1] == pytest.approx(2 / 3)  # reports recompute the same


def test_bad_cancel_flags_are_usage_errors_before_anything_is_sent(tmp_path) -> None:
    app = typer.Typer()
    sweep.commands.register(app, {"lab": typer.Typer()})
    base = ["sweep", "--url", "http://127.0.0.1:9/v1", "--concurrency", "1"]
    cases = {
        ("--cancel-rate", "1.5", "--cancel-after", "2s"): "--cancel-rate must be in [0, 1]",
        ("--cancel-rate", "0.5", "--cancel-after", "2"): "--cancel-after takes a time",
        ("--cancel-rate", "0.5"): "--cancel-rate needs --cancel-after",
        ("--steady-window", "sometimes"): "--steady-window takes 'auto'",
        ("--steady-window", "auto", "--warmup-seconds", "2"): "--steady-window auto detects the window",
    }
    for i, (flags, message) in enumerate(cases.items()):
        out = tmp_path / f"run{i}"
        result = CliRunner().invoke(app, [*base, *flags, "--output-dir", str(out)])
        assert result.exit_code == 2 and message in result.output, (flags, result.output)
        assert not out.exists()  # refused before the tokenizer, the target or the run directory
