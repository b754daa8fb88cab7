"""The API process's hand-over in bench simulate: the serial stage alone, then in front of the engine."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.engine_core import EngineCore
from engine.executor.cost_model import CostModel
from engine.executor.simulated import SimulatedExecutor
from sweep.point.runner import WorkloadConfig
from sweep.simulate.api_process import replay
from sweep.simulate.point import SimulatedRequest, simulate_point
from sweep.simulate.simulation import SimulateConfig, load_profile, run_simulation

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
COST = CostModel({"overhead": 0.010, "tokens": 0.001})  # 10 ms a step + 1 ms a token
HAND_OVER = (0.001, 0.0005)  # 1 ms a request on the event loop, 0.5 ms a prompt token on the tokenizer


def ms(seconds: list[float]) -> list[float]:
    return [round(1e3 * s, 9) for s in seconds]


def test_a_burst_of_short_prompts_is_handed_over_together_after_all_are_parsed() -> None:
    # 1 ms a request, 0.1 ms a token: parsed at 1, 2, 3 ms; tokenised (1 ms each) at 2, 3, 4 ms. The loop parses
    # the whole burst (sent before 2 ms) before it hands the first over: 3, 3, 4 ms.
    assert ms(replay([0.0, 0.0, 0.0], [10, 10, 10], 0.001, 0.0001)) == pytest.approx([3.0, 3.0, 4.0])


def test_long_prompts_are_handed_over_one_by_one_as_each_is_tokenised() -> None:
    assert ms(replay([0.0, 0.0], [100, 100], 0.001, 0.0001)) == pytest.approx([11.0, 21.0])  # parsed 1, 2 ms
    # a request sent before the first is tokenised is parsed first: the loop is busy until 11.5 ms
    assert ms(replay([0.0, 0.0105], [100, 1], 0.001, 0.0001)) == pytest.approx([11.5, 11.6])
    assert ms(replay([0.0, 0.0115], [100, 1], 0.001, 0.0001)) == pytest.approx([11.0, 12.6])  # sent after: not
    assert replay([0.5, 0.2], [4, 4], 0.0, 0.0) == [0.5, 0.2]  # no terms: handed over when sent


def engine() -> tuple[EngineCore, SimulatedExecutor]:
    config = EngineConfig.from_kwargs(model="tiny-random", block_size=4, max_model_len=64)
    executor = SimulatedExecutor(COST, num_blocks=64, max_model_len=64)
    return EngineCore(config, executor=executor), executor


def request(index: int, prompt_len: int, output_len: int) -> SimulatedRequest:
    return SimulatedRequest(index, [100 + 7 * index + i for i in range(prompt_len)], output_len)


def test_an_idle_engine_starts_with_the_first_request_handed_over() -> None:
    core, executor = engine()
    requests = [request(i, 4, 2) for i in range(3)]
    point = simulate_point(core, executor, requests, [0.0] * 3, concurrency=None, hand_over=HAND_OVER)
    a, b, c = point.records
    # parsed at 1, 2, 3 ms; tokenised (2 ms each) at 3, 5, 7 ms; handed over at 3 (the burst parsed), 5, 7 ms.
    # Step 1 at 3 ms: A's prefill alone (14 ms) -> 17. Step 2: A's decode + B's and C's prefills, 9 tokens (19 ms)
    # -> 36. Step 3: B's and C's decodes (12 ms) -> 48.
    assert ms(a.chunk_times) == pytest.approx([17.0, 36.0])
    assert ms(b.chunk_times) == pytest.approx([36.0, 48.0]) and ms(c.chunk_times) == pytest.approx([36.0, 48.0])
    assert ms([r.ttft for r in (a, b, c)]) == pytest.approx([17.0, 36.0, 36.0])  # all three 22 ms without
    assert ms([r.server_timing["arrival_time"] for r in (a, b, c)]) == pytest.approx([3.0, 5.0, 7.0])
    assert ms([r.server_timing["first_scheduled_time"] for r in (a, b, c)]) == pytest.approx([3.0, 17.0, 17.0])
    without = simulate_point(*engine(), [request(i, 4, 2) for i in range(3)], [0.0] * 3, concurrency=None)
    assert ms([r.ttft for r in without.records]) == pytest.approx([22.0, 22.0, 22.0])


def test_a_closed_loop_refill_waits_for_its_hand_over() -> None:
    core, executor = engine()
    requests = [request(i, 4, 2) for i in range(3)]
    point = simulate_point(core, executor, requests, [0.0] * 3, concurrency=2, hand_over=HAND_OVER)
    a, b, c = point.records
    # A, B handed over at 3 (B parsed at 2) and 5 ms. Step 1: A alone 3 -> 17; step 2: A's decode + B's prefill
    # (15 ms) -> 32, A done and C sent; step 3: B's decode (11 ms) -> 43, while C is handed over at 32 + 1 + 2 =
    # 35 ms. Step 4: C's prefill 43 -> 57; step 5: its decode -> 68.
    assert ms([a.send_time, b.send_time, c.send_time]) == pytest.approx([0.0, 0.0, 32.0])
    assert ms(b.chunk_times) == pytest.approx([32.0, 43.0]) and ms(c.chunk_times) == pytest.approx([57.0, 68.0])
    assert ms([r.ttft for r in (a, b, c)]) == pytest.approx([17.0, 32.0, 25.0])
    assert c.server_timing["arrival_time"] == pytest.approx(0.035)


def test_hand_over_terms_in_the_profile_reach_the_points(tmp_path: Path) -> None:
    serving = {"hand_over_per_request": 0.001, "hand_over_per_prompt_token": 0.0005}
    (tmp_path / "p.json").write_text(json.dumps({
        "kind": "servelab-step-profile", "knobs": {"model": "tiny-random", "dtype": "float32"},
        "kv_cache": {"tokens": 4096}, "cost_model": {"coefficients": {"overhead": 0.01}, "serving": serving},
    }))  # fmt: skip
    profile = load_profile(tmp_path / "p.json")
    assert profile.cost_model.hand_over == (0.001, 0.0005)
    config = SimulateConfig(
        output_dir=tmp_path / "run", profile=profile, values=[2], engine_knobs={"max_model_len": 128},
        workload=WorkloadConfig(workload="random", input_len=16, output_len=4), num_prompts=4,
    )  # fmt: skip
    run = run_simulation(config)
    point = json.loads((run / "points" / "c0002.json").read_text())
    assert point["simulation"]["hand_over"] == {"per_request_s": 0.001, "per_prompt_token_s": 0.0005}
    assert json.loads((run / "config.json").read_text())["target"]["cost_model"]["serving"] == serving


def test_without_hand_over_terms_the_records_are_main_s() -> None:
    """tests/fixtures/simulate_rows_3f20c43.json: these points' rows (send, chunk, arrival and first-scheduled
    times) as simulated by main at 3f20c43, before the hand-over existed; a profile without hand-over terms must
    reproduce them exactly."""
    profile = {
        "kind": "servelab-step-profile", "knobs": {"model": "tiny-random", "dtype": "float32"},
        "kv_cache": {"tokens": 4096}, "cost_model": {"coefficients": {"overhead": 0.01, "tokens": 0.001},
                                                     "serving": {"step_overhead": 0.002, "per_seq": 0.001}},
    }  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        (tmp / "p.json").write_text(json.dumps(profile))
        assert load_profile(tmp / "p.json").cost_model.hand_over is None
        for mode, values in (("concurrency", [1.0, 4.0]), ("rate", [40.0])):
            config = SimulateConfig(
                output_dir=tmp / mode, profile=load_profile(tmp / "p.json"), mode=mode, values=values,
                engine_knobs={"max_model_len": 128, "max_num_seqs": 3},
                workload=WorkloadConfig(workload="random", input_len=24, output_len=6, range_ratio=0.5),
                num_prompts=10,
            )  # fmt: skip
            for line in (run_simulation(config) / "requests.jsonl").read_text().splitlines():
                r = json.loads(line)
                timing = r["server_timing"]
                rows.append([mode, r["label"], r["index"], r["send_time"], r["chunk_times"], timing["arrival_time"],
                             timing["first_scheduled_time"]])  # fmt: skip
    assert rows == json.loads((FIXTURES / "simulate_rows_3f20c43.json").read_text())
