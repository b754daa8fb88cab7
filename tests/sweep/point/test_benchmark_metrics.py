"""vLLM's calculate_metrics on hand-computed examples."""

from __future__ import annotations

import math

import pytest

from sweep.point.benchmark_metrics import calculate_metrics, parse_slo, percentile_name, queue_inclusive_applies
from sweep.point.records import RequestRecord


def record(
    index: int,
    send: float,
    chunks: list[float],
    tokens: list[int],
    prompt: int,
    intended: float | None = None,
    error: str | None = None,
    timing: dict | None = None,
) -> RequestRecord:
    r = RequestRecord(
        index=index,
        requested_input_len=prompt,
        requested_output_len=sum(tokens),
        intended_send_time=send if intended is None else intended,
        send_time=send,
    )
    r.success = error is None
    r.error = error
    r.chunk_times, r.chunk_tokens = chunks, tokens
    r.first_token_time = chunks[0] if chunks else None
    r.last_token_time = chunks[-1] if chunks else None
    r.end_time = (chunks[-1] if chunks else send) + 0.001
    r.output_tokens, r.prompt_tokens = sum(tokens), prompt
    r.server_timing = timing
    return r


@pytest.fixture
def runs() -> list[RequestRecord]:
    timing = {"arrival_time": 4.0, "first_scheduled_time": 4.03125, "first_token_time": 4.09375}
    return [
        # a multi-token chunk: 4 tokens in 3 chunks; TTFT 125 ms, E2EL 500 ms, TPOT 375/3 = 125 ms, ITL 125, 250
        record(0, 0.0, [0.125, 0.25, 0.5], [1, 2, 1], prompt=10, timing=timing),
        # a one-token output: no TPOT; sent 0.5 s after it was due (a full concurrency cap)
        record(1, 1.0, [1.25], [1], prompt=20, intended=0.5),
        record(2, 1.5, [], [], prompt=30, error="HTTPStatus 500: boom"),
    ]


def test_vllm_fields(runs: list[RequestRecord]) -> None:
    m = calculate_metrics(runs, duration=2.0, percentiles=[50, 99])
    assert (m["completed"], m["failed"]) == (2, 1)
    assert (m["total_input_tokens"], m["total_output_tokens"]) == (30, 5)  # failures contribute no tokens (vLLM)
    assert m["request_throughput"] == pytest.approx(1.0)
    assert m["output_throughput"] == pytest.approx(2.5)
    assert m["total_token_throughput"] == pytest.approx(17.5)
    assert m["mean_ttft_ms"] == pytest.approx(187.5)
    assert m["std_ttft_ms"] == pytest.approx(62.5)  # population std, as numpy's default
    assert m["p99_ttft_ms"] == pytest.approx(248.75)  # linear interpolation between 125 and 250
    assert m["mean_tpot_ms"] == pytest.approx(125.0)  # only the request with > 1 token
    assert m["std_tpot_ms"] == pytest.approx(0.0)
    assert m["mean_itl_ms"] == pytest.approx(187.5)  # pooled chunk gaps: 125 and 250
    assert m["median_itl_ms"] == pytest.approx(187.5)
    assert m["mean_e2el_ms"] == pytest.approx(375.0)
    assert m["request_goodput"] is None and m["slo_attainment"] is None
    # request 0 streams 4 tokens in [0, 0.5]; request 1 one token at 1.25: bucket 0 holds 4 tokens
    assert m["max_output_tokens_per_s"] == 4.0 and m["max_concurrent_requests"] == 1  # [0, .5) and [1, 1.25)


def test_goodput_counts_failures_as_misses(runs: list[RequestRecord]) -> None:
    m = calculate_metrics(runs, duration=2.0, slo={"ttft_ms": 200.0})
    assert m["request_goodput"] == pytest.approx(0.5)  # only request 0 has TTFT <= 200 ms
    assert m["slo_attainment"] == pytest.approx(1 / 3)  # ... out of three requests, the failure included
    # a one-token output has TPOT 0 and passes any TPOT SLO (vLLM); request 0's TPOT of 125 ms misses 100 ms
    m = calculate_metrics(runs, duration=2.0, slo={"tpot_ms": 100.0})
    assert m["request_goodput"] == pytest.approx(0.5)
    m = calculate_metrics(runs, duration=2.0, slo={"ttft_ms": 1000.0, "tpot_ms": 125.0, "e2el_ms": 500.0})
    assert m["slo_attainment"] == pytest.approx(2 / 3)  # limits are inclusive


def test_queue_inclusive_and_decomposition(runs: list[RequestRecord]) -> None:
    m = calculate_metrics(runs, duration=2.0, percentiles=[50], queue_inclusive=True)
    # vLLM's fields over successful requests: queue 0 and 500 ms; E2EL 500 ms, and 250 + 500 for the delayed one
    assert m["mean_client_queue_time_ms"] == pytest.approx((0.0 + 500.0) / 2)
    assert m["mean_e2el_including_client_queue_ms"] == pytest.approx((500.0 + 750.0) / 2)
    assert m["mean_queue_ms"] == pytest.approx(31.25)
    assert m["mean_prefill_ms"] == pytest.approx(62.5)
    assert m["mean_ttft_rest_ms"] == pytest.approx(31.25)  # 125 ms TTFT - 31.25 - 62.5
    assert "mean_client_queue_time_ms" not in calculate_metrics(runs, duration=2.0)


def test_empty_and_all_failed() -> None:
    m = calculate_metrics([], duration=1.0, slo={"ttft_ms": 1.0})
    assert (m["completed"], m["failed"], m["mean_ttft_ms"], m["p99_e2el_ms"]) == (0, 0, 0.0, 0.0)
    assert m["max_output_tokens_per_s"] == 0.0 and m["max_concurrent_requests"] == 0
    assert m["slo_attainment"] is None and m["request_goodput"] == 0.0
    failed = [record(i, 0.0, [], [], 5, error="ClientConnectorError: refused") for i in range(2)]
    m = calculate_metrics(failed, duration=1.0, slo={"e2el_ms": 1e9})
    assert (m["completed"], m["failed"], m["slo_attainment"], m["total_input_tokens"]) == (0, 2, 0.0, 0)


def test_parse_slo_and_percentile_names() -> None:
    assert parse_slo("ttft=500,tpot=50") == {"ttft_ms": 500.0, "tpot_ms": 50.0}
    assert parse_slo("e2el:2000 ttft:1") == {"e2el_ms": 2000.0, "ttft_ms": 1.0}  # vLLM's --goodput spelling
    assert parse_slo(None) is None
    for bad in ("itl=5", "ttft", "ttft=fast", "tpot=-1"):
        with pytest.raises(ValueError):
            parse_slo(bad)
    assert [percentile_name(p) for p in (50, 99.0, 99.9)] == ["p50", "p99", "p99.9"]
    m = calculate_metrics([record(0, 0.0, [0.1, 0.2], [1, 1], 3)], 1.0, percentiles=[99.9])
    assert math.isclose(m["p99.9_ttft_ms"], 100.0)


def test_peaks_overlap() -> None:
    overlapping = [
        record(0, 0.0, [0.5, 1.5], [3, 3], 1),
        record(1, 1.0, [1.25, 2.0], [2, 2], 1),
        record(2, 2.0, [2.5], [1], 1),
    ]
    m = calculate_metrics(overlapping, duration=3.0)
    assert m["max_concurrent_requests"] == 2  # 0 and 1 overlap in [1.0, 1.5); 2 starts as 1 ends
    assert m["max_output_tokens_per_s"] == 5.0  # bucket [1, 2): 3 + 2 tokens


def test_queue_inclusive_only_for_an_open_loop_with_a_cap() -> None:
    assert queue_inclusive_applies(4, 2.0) and queue_inclusive_applies(4, "2.5")
    assert not queue_inclusive_applies(4, math.inf) and not queue_inclusive_applies(4, "inf")  # closed loop
    assert not queue_inclusive_applies(None, 2.0)  # no cap: nothing queues in the client


def test_requests_never_sent_are_counted_and_miss_the_slo(runs: list[RequestRecord]) -> None:
    unsent = [RequestRecord(i, 10, 4, intended_send_time=1.8, sent=False, error="NotSent: ...") for i in (3, 4)]
    m = calculate_metrics(runs + unsent, duration=2.0, slo={"ttft_ms": 1000.0})
    assert (m["completed"], m["failed"], m["not_sent"]) == (2, 1, 2)
    assert m["slo_attainment"] == pytest.approx(2 / 5)  # the unsent requests are misses, not absent
