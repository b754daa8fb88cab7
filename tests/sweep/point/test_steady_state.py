"""Steady-state windows, hand-computed: t0 = 0, the point ends at 10 s, warm-up 2 s and cool-down 2 s."""

from __future__ import annotations

import pytest

from sweep.point.records import RequestRecord
from sweep.point.steady_state import steady_metrics, window_records


def done(index: int, send: float, chunks: list[float]) -> RequestRecord:
    return RequestRecord(
        index,
        8,
        len(chunks),
        intended_send_time=send,
        send_time=send,
        success=True,
        first_token_time=chunks[0],
        last_token_time=chunks[-1],
        end_time=chunks[-1],
        chunk_times=chunks,
        chunk_tokens=[1] * len(chunks),
        prompt_tokens=8,
        output_tokens=len(chunks),
    )


RECORDS = [
    done(0, 0.0, [0.5, 1.0]),  # the ramp: sent before 2 s
    done(1, 3.0, [3.2, 3.5, 4.0]),  # inside: TTFT 200 ms
    done(2, 2.5, [3.0, 7.0]),  # inside: TTFT 500 ms
    done(3, 7.0, [7.5, 8.5, 9.0]),  # the drain: finishes after 8 s
    RequestRecord(4, 8, 2, intended_send_time=5.0, sent=False, error="NotSent: ..."),  # due inside, never sent
]


def test_window_membership() -> None:
    assert [r.index for r in window_records(RECORDS, 2.0, 8.0)] == [1, 2, 4]


def test_steady_figures_leave_out_ramp_and_drain() -> None:
    m = steady_metrics(
        RECORDS, t0=0.0, duration=10.0, warmup_s=2.0, cooldown_s=2.0, percentiles=[50], slo={"ttft_ms": 300.0}
    )
    assert m is not None and (m["window_start_s"], m["window_end_s"]) == (2.0, 8.0)
    assert (m["completed"], m["not_sent"]) == (2, 1)
    assert m["median_ttft_ms"] == pytest.approx(350.0)  # 200 and 500 ms; the ramp's and drain's are left out
    assert m["slo_attainment"] == pytest.approx(1 / 3)  # only request 1 meets 300 ms; the unsent one misses
    # inside [2, 8]: chunks of request 1 (3), request 2 (2) and request 3 (7.5): 6 tokens over 6 s
    assert m["output_throughput"] == pytest.approx(6 / 6.0)
    assert m["request_throughput"] == pytest.approx(2 / 6.0)  # requests 1 and 2 finished inside


def test_no_window_when_the_point_is_too_short() -> None:
    assert steady_metrics(RECORDS, 0.0, 3.0, 2.0, 2.0, [50]) is None
