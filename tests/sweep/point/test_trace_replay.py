"""Trace replay: each request at its trace timestamp, scaled; the first requests of the trace, in order."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import sweep
from sweep.mock.calibrate import start_mock
from sweep.point.prompts import replay_prompts
from sweep.point.runner import WorkloadConfig
from sweep.run.launcher import ServerProcess
from sweep.run.sweeper import SweepConfig, run_sweep
from workloads.replay import offered_rate

TIMESTAMPS = [100.0, 100.1, 100.15, 100.4, 100.45, 100.8, 101.6]


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "trace.csv"
    rows = [f"{t},{24 + i},{3 + i % 3}" for i, t in enumerate(TIMESTAMPS)]
    path.write_text("timestamp,input_len,output_len\n" + "\n".join(rows) + "\n")
    return path


@pytest.fixture(scope="module")
def mock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with start_mock(5.0, 1.0, tmp_path_factory.mktemp("mock") / "mock.log") as server:
        yield server


def test_replay_windows_and_offsets(trace: Path) -> None:
    from engine.tokenizer import get_tokenizer

    tokenizer = get_tokenizer("tiny-random")
    workload = WorkloadConfig(workload=str(trace))
    specs, prompts, _, offsets = replay_prompts(workload, tokenizer, 0.5, None, None, salt="s")
    assert offsets == pytest.approx([(t - 100.0) * 0.5 for t in TIMESTAMPS])  # half the trace's gaps: 2x speed
    assert [p.input_len for p in prompts] == [24 + i for i in range(7)]  # trace order, not a sample
    _, first, _, _ = replay_prompts(workload, tokenizer, 1.0, 3, None, salt="s")
    assert [p.input_len for p in first] == [24, 25, 26]  # --num-prompts: the first N of the trace
    _, timed, _, offsets = replay_prompts(workload, tokenizer, 2.0, None, 1.0, salt="s")
    assert offsets == pytest.approx([0.0, 0.2, 0.3, 0.8, 0.9])  # --duration: those due before 1 s
    assert offered_rate([0.0, 0.5, 2.0]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="--replay needs a workload with timestamps"):
        replay_prompts(WorkloadConfig(workload="random", input_len=8, output_len=2), tokenizer, 1, 4, None, "s")


def test_sweep_replays_the_trace(mock: ServerProcess, trace: Path, tmp_path: Path) -> None:
    cfg = SweepConfig(
        output_dir=tmp_path / "replay",
        mode="replay",
        values=[0.5],
        url=mock.url,
        model="mock",
        tokenizer="tiny-random",
        workload=WorkloadConfig(workload=str(trace)),
        num_prompts=None,
        percentiles=[50.0],
        command="bench sweep (test)",
    )
    results = sweep.load_results(run_sweep(cfg))
    point, rows = results.points.iloc[0], results.requests
    assert point["label"] == "t000.500" and point["time_scale"] == 0.5 and point["completed"] == 7
    assert point["request_rate"] == pytest.approx(6 / 0.8)  # 6 gaps over the replayed 1.6 s * 0.5
    t0 = rows["intended_send_time"].min()
    assert (rows["intended_send_time"] - t0).tolist() == pytest.approx([(t - 100.0) * 0.5 for t in TIMESTAMPS])
    assert point["fidelity"]["client"]["send_lag"]["p50_ms"] < 20  # the lag is recorded (and small)
