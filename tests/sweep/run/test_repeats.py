"""`--repeats`: interleaved order, pooled points, per-repeat rows, and resume mid-repeat."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import sweep
import sweep.run.sweeper
from sweep.mock.calibrate import start_mock
from sweep.point.runner import WorkloadConfig
from sweep.run.launcher import ServerProcess
from sweep.run.repeats import repeat_order, spread
from sweep.run.sweeper import SweepConfig, run_sweep


@pytest.fixture(scope="module")
def mock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with start_mock(2.0, 1.0, tmp_path_factory.mktemp("mock") / "mock.log") as server:
        yield server


def config(mock: ServerProcess, out: Path, **overrides: object) -> SweepConfig:
    fields = dict(
        output_dir=out,
        values=[1, 2],
        url=mock.url,
        model="mock",
        tokenizer="tiny-random",
        workload=WorkloadConfig(workload="random", input_len=16, output_len=4, seed=1),
        num_prompts=5,
        repeats=3,
        slo={"ttft_ms": 10_000.0},
        command="bench sweep (test)",
    )
    fields.update(overrides)
    return SweepConfig(**fields)  # type: ignore[arg-type]


def test_repeat_order_is_serpentine() -> None:
    assert repeat_order([1, 2, 4], 3) == [(0, 1), (0, 2), (0, 4), (1, 4), (1, 2), (1, 1), (2, 1), (2, 2), (2, 4)]
    assert repeat_order([1, 2], 1) == [(0, 1), (0, 2)]


def test_spread() -> None:
    assert spread([10.0, 12.0, 11.0]) == pytest.approx(0.2)
    assert spread([10.0, None]) is None


def test_repeats_pool_into_one_point(mock: ServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    labels: list[str] = []
    real_run_point = sweep.run.sweeper.run_point
    monkeypatch.setattr(
        sweep.run.sweeper, "run_point", lambda *a, **k: (labels.append(a[1].label), real_run_point(*a, **k))[1]
    )
    run_dir = run_sweep(config(mock, tmp_path / "run", calibration=True))
    assert labels == ["c0001", "c0002", "c0002", "c0001", "c0001", "c0002"]
    results = sweep.load_results(run_dir)
    assert sorted(results.points["label"]) == ["c0001", "c0002"]
    requests = results.requests
    assert len(requests) == 30
    assert requests.groupby(["label", "repeat"]).size().tolist() == [5] * 6
    point = results.points.set_index("label").loc["c0001"]
    assert point["num_repeats"] == 3 and point["completed"] == 15 and point["num_prompts"] == 15
    assert point["duration"] == pytest.approx(sum(r["duration"] for r in point["repeats"]))
    assert point["output_throughput"] == pytest.approx(point["total_output_tokens"] / point["duration"])
    assert results.config["sweep"]["repeats"] == 3
    speed = results.config["calibration"]["speed"]
    assert speed["cpu_matmul_gflops"] > 0 and speed["python_loop_mops"] > 0
    assert set(results.config["calibration"]["client"]) == {"ttft_error_p50_ms", "tpot_error_p50_ms"}


def test_resume_keeps_finished_repeats(mock: ServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_run_point = sweep.run.sweeper.run_point
    calls: list[str] = []

    def interrupt_fourth(*args, **kwargs):
        calls.append(args[1].label)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real_run_point(*args, **kwargs)

    monkeypatch.setattr(sweep.run.sweeper, "run_point", interrupt_fourth)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run_sweep(config(mock, out))
    assert sorted(p.name for p in (out / "repeats").iterdir()) == ["c0001.r0.json", "c0002.r0.json", "c0002.r1.json"]
    assert not list((out / "points").iterdir())
    calls.clear()
    monkeypatch.setattr(
        sweep.run.sweeper, "run_point", lambda *a, **k: (calls.append(a[1].label), real_run_point(*a, **k))[1]
    )
    with pytest.raises(FileExistsError):
        run_sweep(config(mock, out))  # finished repeats are never thrown away without --resume
    run_sweep(config(mock, out, resume=True))
    assert calls == ["c0001", "c0001", "c0002"]
    results = sweep.load_results(out)
    assert results.requests.groupby(["label", "repeat"]).size().tolist() == [5] * 6


def test_repeats_with_a_steady_window_pool_the_windows(mock: ServerProcess, tmp_path: Path) -> None:
    cfg = config(mock, tmp_path / "steady", values=[2], repeats=2, num_prompts=16, warmup_seconds=0.004,
                 cooldown_seconds=0.004)
    results = sweep.load_results(run_sweep(cfg))
    point, rows = results.points.iloc[0], results.requests
    assert point["window"] == "steady" and point["num_repeats"] == 2
    assert point["duration"] == pytest.approx(sum(r["duration"] for r in point["repeats"]))
    inside = rows[rows["in_window"].astype(bool)]
    assert 0 < point["completed"] == inside["success"].sum() < rows["success"].sum()
