"""Steady-state windows, hand-computed: t0 = 0, the point ends at 10 s, warm-up 2 s and cool-down 2 s; the detected
window of a point with a ramp, a plateau and a drain; and the window's figures as the point's reported ones."""

from __future__ import annotations

import pytest

from sweep.point.benchmark_metrics import calculate_metrics
from sweep.point.records import RequestRecord
from sweep.point.steady_state import auto_window, steady_metrics, window_records, windowed_point


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


def plateau_records() -> list[RequestRecord]:
    """A 20 s closed loop at ~4 in flight from 2 s to 16 s, with a 2 s ramp (1 in flight) and a 4 s drain (1)."""
    records = [done(0, 0.0, [0.5, 2.0])]  # the ramp: one request
    index = 1
    for stream in range(4):  # four streams of 1-s requests, 2 s .. 16 s
        for k in range(14):
            send = 2.0 + k + stream * 0.01
            records.append(done(index, send, [send + 0.2, send + 0.99]))
            index += 1
    records.append(done(index, 16.0, [16.5, 20.0]))  # the drain: one long request
    return records


def test_auto_window_finds_the_plateau_of_in_flight_requests() -> None:
    records = plateau_records()
    window = auto_window(records, t0=0.0, duration=20.0)
    assert window == pytest.approx((2.0, 16.0))  # bins of 1 s; the ramp and the drain fall outside the band
    assert auto_window([], 0.0, 20.0) is None


def test_windowed_point_reports_the_window_and_keeps_the_whole_point() -> None:
    records = list(RECORDS)
    full = calculate_metrics(records, 10.0, [50], {"ttft_ms": 300.0})
    point = windowed_point({"label": "c0001", **full}, records, 0.0, (2.0, 8.0), "fixed", [50], {"ttft_ms": 300.0},
                           False)
    assert (point["window"], point["window_rule"], point["duration"]) == ("steady", "fixed", pytest.approx(6.0))
    assert point["completed"] == 2 and point["slo_attainment"] == pytest.approx(1 / 3)
    assert point["full"]["completed"] == 4 and point["full"]["duration"] == 10.0
    assert "total_token_throughput" not in point and "total_token_throughput" in point["full"]
    assert [r.in_window for r in records] == [False, True, True, False, True]


def test_the_window_a_point_is_reported_over() -> None:
    from sweep.point.point_fields import point_window
    from sweep.point.runner import PointRun, PointSpec

    spec = PointSpec(label="c0004", mode="concurrency", concurrency=4, num_prompts=58)
    run = PointRun(spec, plateau_records(), prompts=[], specs=[], t0=0.0, duration=20.0)
    assert point_window(run, 0.0, 0.0, auto=False) is None  # no window asked for: the whole point, unmarked
    assert point_window(run, 3.0, 2.0, auto=False) == ((3.0, 18.0), "fixed")
    assert point_window(run, 12.0, 9.0, auto=False) == (None, "fixed")  # too short: reported whole
    window, rule = point_window(run, 0.0, 0.0, auto=True)  # type: ignore[misc]
    assert rule == "auto" and window == pytest.approx((2.0, 16.0))
