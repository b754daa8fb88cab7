"""ServerMetrics: vLLM's names and label, counters from cumulative engine totals, vLLM's interval rules."""

from __future__ import annotations

import re

from engine.entrypoints.engine_client import RequestStream
from engine.entrypoints.prometheus import ServerMetrics
from engine.outputs import SchedulerStats
from engine.request import Request, RequestTiming
from engine.sampling_params import SamplingParams


def sample(text: str, name: str) -> float:
    match = re.search(rf'^{re.escape(name)}\{{model_name="m"\}} (\S+)$', text, re.MULTILINE)
    assert match, f"{name} missing"
    return float(match.group(1))


def test_gauges_and_counters_follow_engine_stats() -> None:
    metrics = ServerMetrics("m")
    metrics.update_stats(SchedulerStats(num_running_reqs=3, num_waiting_reqs=2, kv_cache_usage=0.25,
                                        prefix_cache_queries=64, prefix_cache_hits=16, num_preemptions=1,
                                        num_prompt_tokens=100, num_generation_tokens=7))  # fmt: skip
    metrics.update_stats(SchedulerStats(num_running_reqs=0, num_waiting_reqs=0, kv_cache_usage=0.0,
                                        prefix_cache_queries=96, prefix_cache_hits=16, num_preemptions=1,
                                        num_prompt_tokens=130, num_generation_tokens=12))  # fmt: skip
    text = metrics.render().decode()
    assert sample(text, "vllm:num_requests_running") == 0 and sample(text, "vllm:kv_cache_usage_perc") == 0
    assert sample(text, "vllm:prefix_cache_queries_total") == 96
    assert sample(text, "vllm:prefix_cache_hits_total") == 16
    assert sample(text, "vllm:num_preemptions_total") == 1
    assert sample(text, "vllm:prompt_tokens_total") == 130
    assert sample(text, "vllm:generation_tokens_total") == 12
    assert "_created" not in text
    # a prefix-cache reset restarts the engine's totals: counters never go backwards
    metrics.update_stats(SchedulerStats(prefix_cache_queries=10, num_prompt_tokens=140, num_generation_tokens=12))
    text = metrics.render().decode()
    assert sample(text, "vllm:prefix_cache_queries_total") == 96 and sample(text, "vllm:prompt_tokens_total") == 140


def test_latency_histograms_use_one_clock_each() -> None:
    metrics = ServerMetrics("m")
    request = Request("r", [1, 2, 3], SamplingParams())
    stream = RequestStream(request, api_arrival=100.0)
    for now in (100.5, 100.6, 100.8):  # API clock: TTFT 0.5, ITLs 0.1 and 0.2
        metrics.observe_tokens(stream, now)
        stream.first_token_api_time = stream.first_token_api_time or now
        stream.last_token_api_time = now
    timing = RequestTiming(arrival_time=7.0, first_scheduled_time=7.25, first_token_time=7.5, finished_time=9.0)
    metrics.observe_finished(stream, timing, "length")  # engine clock: queue 0.25, prefill 0.25, decode 1.5
    text = metrics.render().decode()
    expected = {
        "vllm:time_to_first_token_seconds": (1, 0.5),
        "vllm:inter_token_latency_seconds": (2, 0.3),
        "vllm:e2e_request_latency_seconds": (1, 0.8),
        "vllm:request_queue_time_seconds": (1, 0.25),
        "vllm:request_prefill_time_seconds": (1, 0.25),
        "vllm:request_decode_time_seconds": (1, 1.5),
    }
    for name, (count, total) in expected.items():
        assert sample(text, f"{name}_count") == count, name
        assert abs(sample(text, f"{name}_sum") - total) < 1e-9, name
    assert 'vllm:request_success_total{finished_reason="length",model_name="m"} 1.0' in text


def test_grammar_histograms_count_constrained_requests_only() -> None:
    metrics = ServerMetrics("m")
    stream = RequestStream(Request("r", [1], SamplingParams()), api_arrival=0.0)
    metrics.observe_finished(stream, RequestTiming(arrival_time=1.0), "stop")  # unconstrained: not observed
    constrained = RequestTiming(arrival_time=1.0, grammar_compile_time=0.04, grammar_bitmask_time=0.003,
                                num_grammar_bitmask_steps=6)  # fmt: skip
    metrics.observe_finished(stream, constrained, "stop")
    text = metrics.render().decode()
    assert sample(text, "servelab:request_grammar_compile_time_seconds_count") == 1
    assert sample(text, "servelab:request_grammar_compile_time_seconds_sum") == 0.04
    assert sample(text, "servelab:grammar_bitmask_time_per_step_seconds_count") == 1
    assert abs(sample(text, "servelab:grammar_bitmask_time_per_step_seconds_sum") - 0.0005) < 1e-12


def test_spec_decode_counters_have_vllms_names_and_meanings() -> None:
    from engine.outputs import SpecDecodingStats

    metrics = ServerMetrics("m")
    metrics.update_stats(SchedulerStats())
    assert "spec_decode" not in metrics.render().decode()  # only an engine that speculates reports them
    stats = SpecDecodingStats(num_spec_tokens=3)
    stats.observe(3, 2)  # a request verified 3 drafts and the target accepted the first 2
    stats.observe(2, 0)
    metrics.update_stats(SchedulerStats(spec_decoding_stats=stats))
    stats = SpecDecodingStats(3, stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens,
                              list(stats.num_accepted_tokens_per_pos))  # fmt: skip
    stats.observe(3, 3)
    metrics.update_stats(SchedulerStats(spec_decoding_stats=stats))
    text = metrics.render().decode()
    assert sample(text, "vllm:spec_decode_num_drafts_total") == 3
    assert sample(text, "vllm:spec_decode_num_draft_tokens_total") == 8
    assert sample(text, "vllm:spec_decode_num_accepted_tokens_total") == 5
    per_pos = dict(re.findall(r'^vllm:spec_decode_num_accepted_tokens_per_pos_total\{model_name="m",position="(\d)"\} '
                              r"(\S+)$", text, re.MULTILINE))  # fmt: skip
    assert per_pos == {"0": "2.0", "1": "2.0", "2": "1.0"}
