"""Multi-turn sessions against the mock: later turns carry the history, think time between turns, sessions are the
unit of concurrency."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweep.mock.calibrate import start_mock
from sweep.point.client import ClientConfig
from sweep.point.runner import PointSpec, WorkloadConfig, run_point
from workloads.sessions import group_sessions


def test_group_sessions() -> None:
    assert [len(s) for s in group_sessions(list(range(7)), 3)] == [3, 3, 1]  # type: ignore[arg-type]


def test_turns_carry_the_history(tmp_path: Path) -> None:
    from engine.tokenizer import get_tokenizer

    spec = PointSpec(label="c0002", mode="concurrency", concurrency=2, num_prompts=9, turns=3, think_time_s=0.05)
    workload = WorkloadConfig(workload="random", input_len=12, output_len=3, endpoint="chat")
    with start_mock(5.0, 1.0, tmp_path / "mock.log") as mock:
        run = run_point(
            ClientConfig(mock.url, "mock", endpoint="chat"), spec, workload, get_tokenizer("tiny-random"), salt="s"
        )
    assert len(run.records) == 9 and all(r.success for r in run.records)
    sent = {p.index: p for p in run.prompts}
    by_session: dict[int, list] = {}
    for r in run.records:
        by_session.setdefault(r.session, []).append(r)
    assert sorted(by_session) == [0, 1, 2]
    for turns in by_session.values():
        turns.sort(key=lambda r: r.turn)
        assert [r.turn for r in turns] == [0, 1, 2]
        for k, r in enumerate(turns):
            messages = sent[r.index].messages
            assert len(messages) == 2 * k + 1 and messages[-1]["role"] == "user"
            if k:
                previous = turns[k - 1]
                assert messages[-2] == {"role": "assistant", "content": previous.generated_text}
                assert messages[: 2 * k - 1] == sent[previous.index].messages  # the whole history, in order
                assert r.intended_send_time >= previous.end_time + 0.05  # the think time
        # the server saw the history: each turn's prompt is longer than the one before
        assert turns[0].prompt_tokens < turns[1].prompt_tokens < turns[2].prompt_tokens
    spans = sorted((min(r.send_time for r in t), max(r.end_time for r in t)) for t in by_session.values())
    assert spans[2][0] >= min(spans[0][1], spans[1][1])  # two sessions in flight: the third waits for a slot


def test_turns_need_a_positive_count() -> None:
    with pytest.raises(ValueError, match="--turns"):
        PointSpec(label="x", mode="concurrency", concurrency=1, num_prompts=2, turns=0)


@pytest.mark.slow
def test_history_reuse_shows_in_the_servers_prefix_cache_hit_rate(tmp_path: Path) -> None:
    """The built-in engine's /metrics, scraped over the point: later turns hit the cached history."""
    from sweep.run.sweeper import SweepConfig, run_sweep

    workload = WorkloadConfig(workload="random", input_len=64, output_len=8, endpoint="chat")
    common = dict(
        mode="concurrency",
        values=[1],
        model="tiny-random",
        engine_knobs={"max_num_seqs": 4},
        workload=workload,
        num_prompts=6,
        reset_prefix_cache=True,
        command="bench sweep (test)",
    )
    single = run_sweep(SweepConfig(output_dir=tmp_path / "single", **common))  # type: ignore[arg-type]
    multi = run_sweep(SweepConfig(output_dir=tmp_path / "multi", turns=3, **common))  # type: ignore[arg-type]
    import json

    single_point = json.loads((single / "points" / "c0001.json").read_text())
    multi_point = json.loads((multi / "points" / "c0001.json").read_text())
    assert multi_point["sessions"] == 2 and multi_point["completed"] == 6
    assert single_point["prefix_cache_queries"] > 0  # the scraper read the engine's vLLM-named counters
    assert multi_point["prefix_cache_hit_rate"] > single_point["prefix_cache_hit_rate"] + 0.2
