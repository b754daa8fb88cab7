"""`--client-procs`: requests sharded over processes on one absolute schedule and one clock."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sweep.mock.calibrate import start_mock
from sweep.point.client import ClientConfig, PromptRequest
from sweep.point.multiproc import run_point_sharded, split_concurrency
from sweep.point.runner import PointSpec, schedule


def test_split_concurrency() -> None:
    assert split_concurrency(7, 3) == [3, 2, 2] and split_concurrency(None, 2) == [None, None]


def test_sharded_rate_point(tmp_path: Path) -> None:
    n, rate = 60, 60.0
    spec = PointSpec(label="r", mode="rate", rate=rate, num_prompts=n, concurrency=8, num_warmups=2)
    prompts = [PromptRequest(i, "a b c", None, 3, 4) for i in range(n)]
    offsets = schedule(spec, prompts, seed=0)
    warmups = [PromptRequest(i, "w", None, 1, 2) for i in range(2)]
    done = []
    with start_mock(5.0, 1.0, tmp_path / "mock.log") as mock:
        records, t0, duration, extras = run_point_sharded(
            ClientConfig(mock.url, "mock"), spec, prompts, offsets, warmups, True, 2, lambda: done.append(1)
        )
    assert sorted(r.index for r in records) == list(range(n)) and all(r.success for r in records)
    assert len(done) == n and extras["client_procs"] == 2 and extras["prefix_cache_reset"] is True
    assert extras["warmup_failed"] == 0
    intended = {r.index: r.intended_send_time - t0 for r in records}
    assert [intended[i] for i in range(n)] == pytest.approx(offsets)  # both processes kept the one schedule
    sends = np.sort([r.send_time - t0 for r in records])
    assert n / sends[-1] == pytest.approx(rate, rel=0.05)
    assert duration >= max(r.end_time for r in records) - t0 - 1e-9


def _mean_in_flight(records: list) -> float:
    busy = sum(r.last_token_time - r.send_time for r in records)
    return busy / (max(r.last_token_time for r in records) - min(r.send_time for r in records))


def test_one_global_cap_and_one_queue_keep_the_closed_loop_full(tmp_path: Path) -> None:
    """Even requests are long (40 tokens), odd ones short (1 token). With a fixed shard per process (i mod 2)
    and a fixed half of the cap each, the process holding the short ones idles and the long ones run one at a
    time (mean in flight ~1.1 of 2); one shared queue keeps both slots busy until it is empty."""
    n = 12
    spec = PointSpec(label="c", mode="concurrency", concurrency=2, num_prompts=n)
    prompts = [PromptRequest(i, "a b", None, 2, 40 if i % 2 == 0 else 1) for i in range(n)]
    offsets = schedule(spec, prompts)
    with start_mock(5.0, 2.0, tmp_path / "mock.log") as mock:
        records, _, _, _ = run_point_sharded(ClientConfig(mock.url, "mock"), spec, prompts, offsets, [], False, 2, None)
    assert sorted(r.index for r in records) == list(range(n)) and all(r.success for r in records)
    assert 1.6 < _mean_in_flight(records) <= 2.0 + 1e-9
