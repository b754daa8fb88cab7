"""Cost per million output tokens at goodput: hand-computed, and only good requests' tokens count."""

from __future__ import annotations

import pytest

from sweep.point.records import RequestRecord
from sweep.run.cost import CostConfig, cost_fields, good_output_tokens, occupied_devices


def record(index: int, ttft: float, output_tokens: int, success: bool = True) -> RequestRecord:
    return RequestRecord(
        index, 10, output_tokens, 0.0, send_time=0.0, success=success, first_token_time=ttft,
        last_token_time=ttft + 0.01 * (output_tokens - 1), output_tokens=output_tokens,
    )  # fmt: skip


RECORDS = [record(0, 0.1, 100), record(1, 0.9, 300), record(2, 0.2, 50, success=False)]


def test_cost_counts_only_good_requests_tokens() -> None:
    assert good_output_tokens(RECORDS, None) == 400  # no SLO: every successful request
    assert good_output_tokens(RECORDS, {"ttft_ms": 500.0}) == 100  # request 1 misses the TTFT SLO
    fields = cost_fields(RECORDS, duration=10.0, slo={"ttft_ms": 500.0}, cost=CostConfig(3.6))
    # 100 good tokens in 10 s = 10 tok/s = 36,000 tok/h at $3.60/h -> $100 per million tokens
    assert fields["goodput_output_throughput"] == pytest.approx(10.0)
    assert fields["cost_per_million_output_tokens"] == pytest.approx(100.0)
    assert fields["cost_source"] == "measured" and fields["gpus_per_instance"] == 1


def test_no_good_request_has_no_finite_cost() -> None:
    fields = cost_fields(RECORDS, 10.0, {"ttft_ms": 1.0}, CostConfig(2.0, gpus_per_instance=8), source="simulated")
    assert fields["cost_per_million_output_tokens"] is None and fields["cost_source"] == "simulated"


@pytest.mark.parametrize(("price", "gpus", "message"), [(0.0, 1, "cost-per-hour"), (1.0, 0, "gpus-per-instance")])
def test_bad_prices_are_rejected(price: float, gpus: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CostConfig(price, gpus)


def test_a_configuration_pays_for_the_devices_it_occupies() -> None:
    """At equal throughput a TP = 2 configuration costs twice a TP = 1 one, on one instance or across several."""
    for gpus in (1, 2, 8):
        price = CostConfig(8.0, gpus_per_instance=gpus)
        one, two = (cost_fields(RECORDS, 10.0, None, price, devices_used=d) for d in (1, 2))
        assert two["cost_per_million_output_tokens"] == pytest.approx(2 * one["cost_per_million_output_tokens"])
        assert two["configuration_cost_per_hour"] == pytest.approx(2 * one["configuration_cost_per_hour"])
    share = cost_fields(RECORDS, 10.0, None, CostConfig(8.0, gpus_per_instance=8), devices_used=2)
    assert (share["instances_used"], share["configuration_cost_per_hour"]) == (0.25, 2.0)
    # 400 good tokens in 10 s = 144,000 tok/h at $2/h -> $13.89 per million tokens
    assert share["cost_per_million_output_tokens"] == pytest.approx(2.0 / 144_000 * 1e6)
    spans = cost_fields(RECORDS, 10.0, None, CostConfig(8.0, gpus_per_instance=2), devices_used=3)
    assert (spans["instances_used"], spans["configuration_cost_per_hour"]) == (2.0, 16.0)  # whole instances
    whole = cost_fields(RECORDS, 10.0, None, CostConfig(8.0, gpus_per_instance=8))  # unknown devices
    assert (whole["devices_used"], whole["instances_used"], whole["configuration_cost_per_hour"]) == (None, 1.0, 8.0)


def test_occupied_devices_count_gpu_ranks_and_not_cpu_ones() -> None:
    assert occupied_devices({"tensor_parallel_size": 2}, "cuda") == 2
    assert occupied_devices({"tensor_parallel_size": 4, "pipeline_parallel_size": 2}, "cuda") == 8
    assert occupied_devices({}, "cuda") == 1
    assert occupied_devices({"tensor_parallel_size": 2, "device": "cuda"}) == 2  # the knob says where it runs
    assert occupied_devices({"tensor_parallel_size": 2, "device": "cpu"}) is None  # ranks share the machine
    assert occupied_devices({"tensor_parallel_size": 2}, "cpu") is None
