"""`--client-procs`: requests sharded over processes on one absolute schedule and one clock."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sweep.calibrate import start_mock
from sweep.client import ClientConfig, PromptRequest
from sweep.multiproc import run_point_sharded, split_concurrency
from sweep.runner import PointSpec, schedule


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
    assert (n - 1) / (sends[-1] - sends[0]) == pytest.approx(rate, rel=0.05)
    assert duration >= max(r.end_time for r in records) - t0 - 1e-9
