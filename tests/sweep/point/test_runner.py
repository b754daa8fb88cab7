"""Open-loop schedules reach the offered rate; duration mode stops sending on time; warm-ups are not measured."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import numpy as np
import pytest

from sweep.mock.calibrate import start_mock
from sweep.point.client import ClientConfig, PromptRequest, make_session
from sweep.point.runner import PointSpec, dispatch, schedule, send_offsets
from sweep.run.launcher import ServerProcess


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
    assert n / sends[-1] == pytest.approx(rate, rel=0.05)  # the schedule spans n / rate from t0; the sends follow it
    gaps = np.diff(offsets)
    cv = gaps.std() / gaps.mean()  # gamma inter-arrivals: CV = 1 / sqrt(burstiness)
    assert cv == pytest.approx(1 / np.sqrt(burstiness), rel=0.35)
    assert np.percentile(sends - np.asarray(offsets), 50) < 0.025  # the sends keep to the schedule (a busy CPU lags)
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
    # vLLM's get_request: the first send waits one gap, and the last is at exactly n / rate (the old schedule
    # started at 0 and ended at (n - 1) / rate, offering n / (n - 1) times the rate over its span)
    offsets = send_offsets(spec, 50, seed=1)
    assert offsets[0] > 0 and offsets[-1] == pytest.approx(50 / 10.0)
    with pytest.raises(ValueError):
        PointSpec(label="x", mode="rate", rate=0.0, num_prompts=1)
    with pytest.raises(ValueError):
        PointSpec(label="x", mode="concurrency", concurrency=2)  # neither num_prompts nor duration


def test_a_closed_loop_sends_in_index_order(mock: ServerProcess) -> None:
    """Requests due at once go in index order (the simulation's order), never in the timer heap's."""
    for _ in range(3):
        records, _, _ = run(mock, PointSpec(label="c", mode="concurrency", concurrency=3, num_prompts=9), 9)
        first_wave = sorted(records, key=lambda r: r.send_time)[:3]
        assert sorted(r.index for r in first_wave) == [0, 1, 2]


def test_duration_stops_sending(mock: ServerProcess) -> None:
    spec = PointSpec(label="c", mode="concurrency", concurrency=2, duration=0.3)
    records, t0, _ = run(mock, spec, 500)
    assert 0 < len(records) < 500  # the pool outlasts the duration
    assert max(r.send_time for r in records) < t0 + 0.3 + 0.05
    assert max(r.end_time for r in records) > t0 + 0.3 - 0.05  # in-flight requests finish and count


def test_ramp_up_schedule_follows_vllm() -> None:
    """vLLM's get_request with --ramp-up-strategy: gap i drawn at the rate reached at progress i / (n - 1)."""
    n = 400
    spec = PointSpec(label="ramp", mode="rate", rate=8.0, num_prompts=n, ramp=("linear", 1.0, 8.0))
    gaps = np.diff([0.0, *send_offsets(spec, n, seed=2)])
    assert gaps[0] > 0  # the first send waits one gap, as in vLLM
    assert np.mean(gaps[:100]) > 3 * np.mean(gaps[-100:])  # early gaps at ~1-2.75 req/s, late ones at ~6-8 req/s
    exponential = send_offsets(PointSpec(label="e", mode="rate", rate=8.0, num_prompts=n,
                                         ramp=("exponential", 1.0, 8.0)), n, seed=2)
    assert exponential[-1] > send_offsets(spec, n, seed=2)[-1]  # the same draws, slower rates for longer
    with pytest.raises(ValueError, match="ramp-up"):
        PointSpec(label="x", mode="rate", rate=8.0, num_prompts=4, ramp=("step", 1.0, 8.0))
