"""bench simulate's virtual-time driver: hand-computed timings, the send schedule, the run directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.engine_core import EngineCore
from engine.executor.cost_model import CostModel
from engine.executor.simulated import SimulatedExecutor
from sweep.point.benchmark_metrics import calculate_metrics
from sweep.point.runner import WorkloadConfig
from sweep.run.results import load_results
from sweep.simulate.point import SimulatedRequest, prompt_token_ids, simulate_point
from sweep.simulate.simulation import SimulateConfig, engine_config, load_profile, run_simulation
from workloads.spec import RequestSpec

COST = CostModel({"overhead": 0.010, "tokens": 0.001})  # 10 ms a step + 1 ms a token


def engine(max_model_len: int = 64) -> tuple[EngineCore, SimulatedExecutor]:
    config = EngineConfig.from_kwargs(model="tiny-random", block_size=4, max_model_len=max_model_len)
    executor = SimulatedExecutor(COST, num_blocks=64, max_model_len=max_model_len)
    return EngineCore(config, executor=executor), executor


def request(index: int, prompt_len: int, output_len: int) -> SimulatedRequest:
    return SimulatedRequest(index, [100 + 7 * index + i for i in range(prompt_len)], output_len)


def test_closed_loop_timings_match_the_hand_computed_schedule() -> None:
    core, executor = engine()
    requests = [request(0, 4, 3), request(1, 6, 2), request(2, 2, 2)]
    point = simulate_point(core, executor, requests, [0.0] * 3, concurrency=2)
    a, b, c = point.records
    # step 1: prefill A(4) + B(6) = 10 tokens, 20 ms; step 2: two decodes, 12 ms -> B done at 32 ms and C sent,
    # but the engine is already in step 3 (A's last decode, 11 ms), so C prefills in step 4 (12 ms) and decodes
    # in step 5 (11 ms).
    assert a.chunk_times == pytest.approx([0.020, 0.032, 0.043])
    assert b.chunk_times == pytest.approx([0.020, 0.032])
    assert c.send_time == pytest.approx(0.032) and c.chunk_times == pytest.approx([0.055, 0.066])
    assert [r.ttft for r in (a, b, c)] == pytest.approx([0.020, 0.020, 0.023])
    metrics = calculate_metrics(point.records, point.duration, percentiles=[50])
    assert metrics["duration"] == pytest.approx(0.066)
    assert metrics["mean_tpot_ms"] == pytest.approx((11.5 + 12.0 + 11.0) / 3)
    assert metrics["mean_e2el_ms"] == pytest.approx((43 + 32 + 34) / 3)
    assert point.stats["steps"] == 5 and point.stats["busy_s"] == pytest.approx(0.066)
    assert c.server_timing["first_scheduled_time"] == pytest.approx(0.043)


def test_open_loop_arrival_during_a_step_joins_at_the_next_boundary() -> None:
    core, executor = engine()
    point = simulate_point(core, executor, [request(0, 4, 2), request(1, 4, 2)], [0.0, 0.005], concurrency=None)
    a, b = point.records
    assert b.send_time == pytest.approx(0.005)  # sent on schedule, not at the boundary
    assert a.chunk_times == pytest.approx([0.014, 0.029])  # step 2: A's decode + B's 4-token prefill, 15 ms
    assert b.ttft == pytest.approx(0.029 - 0.005) and b.e2el == pytest.approx(0.040 - 0.005)


def test_duration_stops_sending_and_a_too_long_request_fails() -> None:
    core, executor = engine()
    point = simulate_point(core, executor, [request(0, 4, 3), request(1, 4, 3)], [0.0, 0.0], 1, duration=0.030)
    assert [r.index for r in point.records] == [0]  # A ends at 36 ms; nothing is sent at or after 30 ms
    core, executor = engine(max_model_len=32)
    point = simulate_point(core, executor, [request(0, 30, 8), request(1, 4, 2)], [0.0, 0.0], None)
    failed, ok = point.records
    assert not failed.success and "maximum context length is 32" in (failed.error or "") and ok.success


def test_prompt_ids_share_exactly_the_workload_prefixes() -> None:
    group = [RequestSpec(20, 4, prefix_group=3, prefix_len=8), RequestSpec(12, 4, prefix_group=3, prefix_len=8)]
    first, second = (prompt_token_ids(s, i, "salt") for i, s in enumerate(group))
    assert len(first) == 20 and len(second) == 12 and first[:8] == second[:8] and first[8:12] != second[8:12]
    hashed = [RequestSpec(10, 2, prefix_ids=[5, 6], prefix_block_size=4), RequestSpec(9, 2, prefix_ids=[5, 7],
              prefix_block_size=4)]  # fmt: skip
    x, y = (prompt_token_ids(s, i, "salt") for i, s in enumerate(hashed))
    assert x[:4] == y[:4] and x[4:8] != y[4:8]
    assert prompt_token_ids(group[0], 0, "other")[:8] != first[:8]  # another salt, another prefix


@pytest.fixture
def profile_path(tmp_path: Path) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({
        "kind": "servelab-step-profile", "knobs": {"model": "tiny-random", "dtype": "float32"},
        "kv_cache": {"tokens": 4096}, "cost_model": {"coefficients": {"overhead": 0.01, "tokens": 0.001}},
    }))  # fmt: skip
    return path


def test_simulate_writes_a_sweep_run_directory_marked_simulated(tmp_path: Path, profile_path: Path) -> None:
    config = SimulateConfig(
        output_dir=tmp_path / "run",
        profile=load_profile(profile_path),
        values=[1, 4],
        engine_knobs={"max_num_seqs": 2, "max_model_len": 128},
        workload=WorkloadConfig(workload="random", input_len=16, output_len=4),
        num_prompts=6,
        slo={"ttft_ms": 1000.0},
    )
    run = load_results(run_simulation(config))
    assert run.config["simulated"] is True and run.config["target"]["backend"] == "simulated"
    assert run.config["target"]["num_gpu_blocks"] == 2 * 128 // 16  # capped at max_num_seqs sequences
    assert list(run.points["label"]) == ["c0001", "c0004"] and run.points["simulated"].all()
    assert (run.points["completed"] == 6).all() and len(run.requests) == 12
    # max_num_seqs=2 caps the batch below 4 streams: the others queue
    assert run.points.set_index("label").loc["c0004", "simulation"]["max_running_seqs"] == 2
    assert run.points["output_throughput"].iloc[1] > run.points["output_throughput"].iloc[0]


def test_simulate_refuses_knobs_the_profile_did_not_measure(tmp_path: Path, profile_path: Path) -> None:
    with pytest.raises(ValueError, match="measured with dtype=float32"):
        SimulateConfig(output_dir=tmp_path, profile=load_profile(profile_path), engine_knobs={"dtype": "bfloat16"})
    data = json.loads(profile_path.read_text())
    data["knobs"]["kv_cache_dtype"] = "auto"
    profile_path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="measured with kv_cache_dtype=auto"):
        SimulateConfig(
            output_dir=tmp_path, profile=load_profile(profile_path), engine_knobs={"kv_cache_dtype": "bfloat16"}
        )
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not a `bench model profile` file"):
        load_profile(tmp_path / "bad.json")


def test_simulate_refuses_speculative_decoding(tmp_path: Path, profile_path: Path) -> None:
    config = SimulateConfig(
        output_dir=tmp_path,
        profile=load_profile(profile_path),
        engine_knobs={"max_model_len": 128, "speculative_config": '{"method": "ngram", "num_speculative_tokens": 2}'},
    )
    with pytest.raises(ValueError, match="does not model speculative decoding"):
        engine_config(config)


def test_simulated_kv_cache_follows_kv_cache_memory_bytes(tmp_path: Path, profile_path: Path) -> None:
    """The cap the engine would take, at the profile's bytes per token; without it, the profiled budget."""
    data = json.loads(profile_path.read_text())
    data["kv_cache"]["bytes_per_token"] = 1024
    profile_path.write_text(json.dumps(data))
    knobs = {"max_model_len": 128, "max_num_seqs": 64}
    capped = SimulateConfig(output_dir=tmp_path, profile=load_profile(profile_path),
                            engine_knobs={**knobs, "kv_cache_memory_bytes": "1MiB"})  # fmt: skip
    assert engine_config(capped)[1] == 2**20 // 1024 // 16  # 1024 tokens in blocks of 16
    profiled = SimulateConfig(output_dir=tmp_path, profile=load_profile(profile_path), engine_knobs=knobs)
    assert engine_config(profiled)[1] == 4096 // 16


def test_simulated_points_carry_a_simulated_cost(tmp_path: Path, profile_path: Path) -> None:
    from sweep.run.cost import CostConfig

    config = SimulateConfig(
        output_dir=tmp_path / "run",
        profile=load_profile(profile_path),
        values=[2],
        engine_knobs={"max_model_len": 128},
        workload=WorkloadConfig(workload="random", input_len=16, output_len=4),
        num_prompts=4,
        cost=CostConfig(7.2),
    )
    point = load_results(run_simulation(config)).points.iloc[0]
    assert point["cost_source"] == "simulated"
    expected = 7.2 / (3600 * point["output_throughput"]) * 1e6  # no SLO: every request's tokens are good
    assert point["cost_per_million_output_tokens"] == pytest.approx(expected)
    assert (point["instances_used"], point["configuration_cost_per_hour"]) == (1.0, 7.2)  # one device of one


def test_simulated_max_load_search_writes_search_json(tmp_path: Path, profile_path: Path) -> None:
    config = SimulateConfig(
        output_dir=tmp_path / "run",
        profile=load_profile(profile_path),
        values=[1],
        engine_knobs={"max_num_seqs": 2, "max_model_len": 128},
        workload=WorkloadConfig(workload="random", input_len=16, output_len=8),
        num_prompts=8,
        slo={"ttft_ms": 150.0},  # one or two streams fit; more queue behind max_num_seqs=2
        max_load_under_slo=True,
        max_load=16,
    )
    run_dir = run_simulation(config)
    search = json.loads((run_dir / "search.json").read_text())
    points = load_results(run_dir).points.set_index("label")
    assert search["best"] is not None and 1 <= search["best"] < 16
    passing = points[points["slo_attainment"] >= 0.9]
    assert search["best"] == passing["max_concurrency"].max()
    with pytest.raises(ValueError, match="needs an --slo"):
        SimulateConfig(output_dir=tmp_path / "x", profile=load_profile(profile_path), max_load_under_slo=True)
