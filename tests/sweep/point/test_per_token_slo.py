"""Per-token SLOs: each request's own p99 chunk gap (`itl_p99`) and longest chunk gap (`max_stall`), hand-computed."""

from __future__ import annotations

import pytest

from sweep.point.benchmark_metrics import (
    calculate_metrics,
    is_good,
    parse_slo,
    request_itl_p99,
    request_max_stall,
)
from sweep.point.records import RequestRecord


def record(index: int, send: float, chunks: list[float], error: str | None = None) -> RequestRecord:
    r = RequestRecord(index=index, requested_input_len=8, requested_output_len=len(chunks),
                      intended_send_time=send, send_time=send)  # fmt: skip
    r.success = error is None
    r.error = error
    r.chunk_times, r.chunk_tokens = chunks, [1] * len(chunks)
    r.first_token_time = chunks[0] if chunks else None
    r.last_token_time = chunks[-1] if chunks else None
    r.end_time = (chunks[-1] if chunks else send) + 0.001
    r.output_tokens, r.prompt_tokens = len(chunks), 8
    return r


@pytest.fixture
def runs() -> list[RequestRecord]:
    return [
        # TTFT 100 ms; gaps 100, 300, 100, 1000 ms: longest 1000; p99 = 300 + 0.97 * 700 = 979 ms (sorted 100,
        # 100, 300, 1000; position 0.99 * 3 = 2.97)
        record(0, 0.0, [0.1, 0.2, 0.5, 0.6, 1.6]),
        # TTFT 2000 ms is no stall: one gap of 100 ms
        record(1, 0.0, [2.0, 2.1]),
        # the gap first token -> second counts: 800 ms, then 100
        record(2, 1.0, [1.1, 1.9, 2.0]),
        # one chunk: no gap, passes any per-token SLO (as a one-token output passes TPOT)
        record(3, 1.0, [1.5]),
        record(4, 1.0, [], error="HTTPStatus 500: boom"),
    ]


def test_per_request_gaps_by_hand(runs: list[RequestRecord]) -> None:
    assert request_max_stall(runs[0]) == pytest.approx(1.0)
    assert request_itl_p99(runs[0]) == pytest.approx(0.979)
    assert request_max_stall(runs[1]) == pytest.approx(0.1)  # not the 2 s before the first token
    assert request_itl_p99(runs[1]) == pytest.approx(0.1)
    assert request_max_stall(runs[2]) == pytest.approx(0.8)
    assert request_itl_p99(runs[2]) == pytest.approx(0.1 + 0.99 * 0.7)
    assert request_max_stall(runs[3]) is None and request_itl_p99(runs[3]) is None
    assert request_max_stall(runs[4]) is None


def test_max_stall_slo_decides_good_requests(runs: list[RequestRecord]) -> None:
    slo = parse_slo("max_stall=800")
    assert slo == {"max_stall_ms": 800.0}
    assert [is_good(r, slo) for r in runs] == [False, True, True, True, False]
    m = calculate_metrics(runs, duration=2.0, slo=slo)
    assert m["slo_attainment"] == pytest.approx(3 / 5) and m["request_goodput"] == pytest.approx(1.5)
    m = calculate_metrics(runs, duration=2.0, slo=parse_slo("max_stall=799"))
    assert m["slo_attainment"] == pytest.approx(2 / 5)


def test_itl_p99_slo_and_combinations(runs: list[RequestRecord]) -> None:
    slo = parse_slo("itl_p99=978")
    assert slo == {"itl_p99_ms": 978.0}
    assert [is_good(r, slo) for r in runs] == [False, True, True, True, False]
    assert [is_good(r, parse_slo("itl_p99=980")) for r in runs] == [True, True, True, True, False]
    # request 2's p99 (793 ms) meets 800 but its stall does not meet 790; request 1 misses the TTFT
    both = parse_slo("ttft=1000,itl_p99_ms=800,max_stall=790")
    assert both == {"ttft_ms": 1000.0, "itl_p99_ms": 800.0, "max_stall_ms": 790.0}
    assert [is_good(r, both) for r in runs] == [False, False, False, True, False]
    assert parse_slo("max_stall:250 itl_p99:100") == {"max_stall_ms": 250.0, "itl_p99_ms": 100.0}  # vLLM's syntax


def test_the_point_records_the_stall_distribution(runs: list[RequestRecord]) -> None:
    m = calculate_metrics(runs, duration=2.0, percentiles=[50, 99])
    # over the successful requests with 2+ chunks: 1000, 100, 800 ms
    assert m["mean_max_stall_ms"] == pytest.approx(633.333, abs=1e-3)
    assert m["median_max_stall_ms"] == pytest.approx(800.0)
    assert m["p99_max_stall_ms"] == pytest.approx(800.0 + 0.98 * 200.0)
    assert m["std_max_stall_ms"] > 0


@pytest.mark.parametrize(("text", "message"), [
    ("itl_p95=50", "bad SLO item 'itl_p95=50'"),
    ("stall=50", "itl_p99=MS,max_stall=MS"),
    ("max_stall=fast", "milliseconds must be a number"),
    ("itl_p99=-1", "SLO itl_p99 must be >= 0 ms"),
])
def test_parse_errors_are_clear(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        parse_slo(text)
