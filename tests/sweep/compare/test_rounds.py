"""`bench compare`'s rounds: the measuring order (ABBA over targets and loads), and real rounds against mock
servers (sweep/mock/server.py), one at a time and together, each target an ordinary run directory."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from rich.console import Console

from sweep.compare.rounds import CompareConfig, round_order, run_compare, target_sweep
from sweep.compare.targets import Target, TargetError
from sweep.point.runner import WorkloadConfig
from sweep.run.sweep_config import SweepConfig

MOCK = f"{shlex.quote(sys.executable)} -m sweep.mock.server --port {{port}} --ttft-ms 5 --itl-ms 2"
A, B, C = Target("a", "engine"), Target("b", "engine"), Target("c", "engine")


def test_one_at_a_time_runs_each_target_s_loads_in_one_go() -> None:
    order = [(r, t.name, loads) for r, t, loads in round_order([A, B, C], [1, 2], 3, together=False)]
    assert order == [
        (0, "a", [1, 2]), (0, "b", [1, 2]), (0, "c", [1, 2]),
        (1, "c", [2, 1]), (1, "b", [2, 1]), (1, "a", [2, 1]),
        (2, "a", [1, 2]), (2, "b", [1, 2]), (2, "c", [1, 2]),
    ]  # fmt: skip


def test_together_interleaves_point_by_point() -> None:
    order = [(r, t.name, loads[0]) for r, t, loads in round_order([A, B], [1, 2], 2, together=True)]
    assert order == [(0, "a", 1), (0, "b", 1), (0, "a", 2), (0, "b", 2),
                     (1, "b", 2), (1, "a", 2), (1, "b", 1), (1, "a", 1)]  # fmt: skip


def _sweep(out: Path, **kwargs: object) -> SweepConfig:
    return SweepConfig(output_dir=out, values=[1.0, 2.0], model="tiny-random", num_prompts=6, repeats=2,
                       workload=WorkloadConfig(workload="random", input_len=16, output_len=6), **kwargs)  # fmt: skip


def test_each_target_gets_its_own_sweep(tmp_path: Path) -> None:
    config = CompareConfig(_sweep(tmp_path, engine_knobs={"max_num_seqs": 4}), [
        Target("e", "engine", knobs={"max_num_seqs": 8}), Target("u", "url", "http://127.0.0.1:9"),
        Target("m", "cmd", MOCK)])  # fmt: skip
    engine, url, mock = (target_sweep(config, t, None) for t in config.targets)
    assert engine.output_dir == tmp_path / "e" and engine.engine_knobs == {"max_num_seqs": 8}
    assert engine.launch_template is None and engine.url is None and engine.repeats == 2
    assert url.url == "http://127.0.0.1:9/v1" and url.engine_knobs == {}
    assert mock.launch_template == MOCK and mock.engine_knobs == {"max_num_seqs": 4}
    assert "[m: cmd:" in mock.command


def test_bad_configs_fail_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(TargetError, match="not a commit"):
        CompareConfig(_sweep(tmp_path), [A, Target("r", "ref", "no-such-ref-xyz")])
    with pytest.raises(TargetError, match="--target"):
        CompareConfig(_sweep(tmp_path, url="http://127.0.0.1:9/v1"), [A, B])


@pytest.mark.parametrize("together", [False, True])
def test_rounds_against_mock_servers(tmp_path: Path, together: bool) -> None:
    targets = [Target("fast", "cmd", MOCK), Target("slow", "cmd", MOCK, extra_args=("--itl-ms", "6"))]
    config = CompareConfig(_sweep(tmp_path), targets, together=together)
    runs = run_compare(config, Console(quiet=True))
    assert runs == {"fast": tmp_path / "fast", "slow": tmp_path / "slow"}
    tpot = {}
    for name, run in runs.items():
        assert sorted(p.name for p in (run / "repeats").iterdir()) == [
            "c0001.r0.json", "c0001.r1.json", "c0002.r0.json", "c0002.r1.json"
        ]
        point = json.loads((run / "points" / "c0002.json").read_text())
        assert point["num_repeats"] == 2 and point["completed"] == 12
        tpot[name] = point["median_tpot_ms"]
        starts = (run / "server.log").read_text().count("$ ")
        assert starts == (1 if together else 2)  # one at a time: started once per round
    assert tpot["slow"] > tpot["fast"]
    with pytest.raises(FileExistsError, match="--resume"):
        run_compare(config, Console(quiet=True))
    again = CompareConfig(_sweep(tmp_path, resume=True), targets, together=together)
    run_compare(again, Console(quiet=True))  # everything is kept: no server starts again
    assert (tmp_path / "fast" / "server.log").read_text().count("$ ") == (1 if together else 2) + together
