"""Open-loop schedules reach the offered rate; duration mode stops sending on time; warm-ups are not measured."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import numpy as np
import pytest

from sweep.calibrate import start_mock
from sweep.client import ClientConfig, PromptRequest, make_session
from sweep.launcher import ServerProcess
from sweep.runner import PointSpec, dispatch, schedule, send_offsets


@pytest.fixture(scope="module")
def mock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with start_mock(5.0, 1.0, tmp_path_factory.mktemp("mock") / "mock.log") as server:
        yield server


def prompts(n: int) -> list[PromptRequest]:
    return [PromptRequest(i, "a b", None, 2, 3) for i in range(n)]


def run(mock: ServerProcess, spec: PointSpec, n: int) -> tuple[list, float, list[float]]:
    batch = prompts(n)
    offsets = schedule(spec, batch, seed=3)

    async def main():
        async with make_session() as session:
            t0 = time.perf_counter() + 0.05
            stop_at = t0 + spec.duration if spec.duration else None
            records = await dispatch(
                session, ClientConfig(mock.url, "mock"), batch, offsets, t0, spec.concurrency, stop_at
            )
        return records, t0

    records, t0 = asyncio.run(main())
    return records, t0, offsets


@pytest.mark.parametrize("burstiness", [1.0, 0.5, 4.0])
def test_arrivals_reach_the_offered_rate(mock: ServerProcess, burstiness: float) -> None:
    rate, n = 80.0, 120
    spec = PointSpec(label="r", mode="rate", rate=rate, burstiness=burstiness, num_prompts=n)
    records, t0, offsets = run(mock, spec, n)
    assert len(records) == n and all(r.success for r in records)
    sends = np.sort([r.send_time - t0 for r in records])
    achieved = (n - 1) / (sends[-1] - sends[0])
    assert achieved == pytest.approx(rate, rel=0.05)  # the schedule spans (n - 1) / rate; the sends follow it
    gaps = np.diff(sends)
    cv = gaps.std() / gaps.mean()  # gamma inter-arrivals: CV = 1 / sqrt(burstiness)
    assert cv == pytest.approx(1 / np.sqrt(burstiness), rel=0.35)
    assert [r.intended_send_time - t0 for r in records] == pytest.approx(offsets)


def test_schedule_shapes() -> None:
    closed = PointSpec(label="c", mode="concurrency", concurrency=4, num_prompts=5)
    assert send_offsets(closed, 5) == [0.0] * 5
    spec = PointSpec(label="r", mode="rate", rate=10.0, duration=2.0)
    assert spec.pool_size == 20
    batch = prompts(spec.pool_size)
    offsets = schedule(spec, batch)
    assert all(o < 2.0 for o in offsets) and len(batch) == len(offsets)
    assert send_offsets(spec, 50, seed=1) == send_offsets(spec, 50, seed=1) != send_offsets(spec, 50, seed=2)
    with pytest.raises(ValueError):
        PointSpec(label="x", mode="rate", rate=0.0, num_prompts=1)
    with pytest.raises(ValueError):
        PointSpec(label="x", mode="concurrency", concurrency=2)  # neither num_prompts nor duration


def test_duration_stops_sending(mock: ServerProcess) -> None:
    spec = PointSpec(label="c", mode="concurrency", concurrency=2, duration=0.3)
    records, t0, _ = run(mock, spec, 500)
    assert 0 < len(records) < 500  # the pool outlasts the duration
    assert max(r.send_time for r in records) < t0 + 0.3 + 0.05
    assert max(r.end_time for r in records) > t0 + 0.3 - 0.05  # in-flight requests finish and count
