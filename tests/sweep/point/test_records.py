"""A request's `requests.jsonl` row: the stored fields, the point's label and the derived latencies."""

from __future__ import annotations

import json

import pytest

from sweep.point.records import RequestRecord


def test_a_row_keeps_the_stored_fields_and_adds_label_and_latencies() -> None:
    record = RequestRecord(3, 16, 4, intended_send_time=9.5, send_time=10.0, success=True,
                           first_token_time=10.25, last_token_time=10.75, end_time=10.8,
                           chunk_times=[10.25, 10.5, 10.75], chunk_tokens=[2, 1, 1], prompt_tokens=16,
                           output_tokens=4, usage_prompt_tokens=16, usage_output_tokens=4,
                           server_timing={"arrival_time": 1.0}, generated_text="four tokens of text")
    row = json.loads(json.dumps(record.to_row("c0002")))
    assert {"generated_text", "usage_prompt_tokens", "usage_output_tokens"}.isdisjoint(row)
    assert row["label"] == "c0002" and row["index"] == 3 and row["chunk_tokens"] == [2, 1, 1]
    assert row["ttft"] == pytest.approx(0.25) and row["e2el"] == pytest.approx(0.75)
    assert row["itl"] == pytest.approx([0.25, 0.25])
    assert row["server_timing"] == {"arrival_time": 1.0}


def test_a_failed_request_has_no_latencies() -> None:
    row = RequestRecord(0, 16, 4, intended_send_time=0.0, error="HTTPStatus 500: boom").to_row("r0001.00")
    assert row["ttft"] is None and row["e2el"] is None and row["itl"] == [] and row["success"] is False
