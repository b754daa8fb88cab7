"""Dollars per million output tokens at a point's goodput: what serving a workload under its SLO costs.

Only good requests' tokens count (vLLM's goodput test: succeeded and met every SLO given; without an SLO every
successful request is good), so a point that answers fast but misses its SLO is expensive, and one with no good
request has no finite cost (None). With the instance's price `cost_per_hour` (USD, one engine instance of
`gpus_per_instance` GPUs):

    goodput_output_throughput = output tokens of good requests / duration            (tokens/s)
    cost_per_million_output_tokens = cost_per_hour / (3600 * goodput_output_throughput) * 1e6
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sweep.point.benchmark_metrics import is_good
from sweep.point.records import RequestRecord


@dataclass(frozen=True)
class CostConfig:
    cost_per_hour: float  # USD per instance-hour
    gpus_per_instance: int = 1

    def __post_init__(self) -> None:
        if not (self.cost_per_hour > 0 and math.isfinite(self.cost_per_hour)):
            raise ValueError(f"--cost-per-hour must be a positive number of USD, got {self.cost_per_hour}")
        if self.gpus_per_instance < 1:
            raise ValueError(f"--gpus-per-instance must be >= 1, got {self.gpus_per_instance}")


def good_output_tokens(records: Sequence[RequestRecord], slo: dict[str, float] | None) -> int:
    return sum(r.output_tokens or 0 for r in records if (is_good(r, slo) if slo else r.success))


def cost_fields(
    records: Sequence[RequestRecord],
    duration: float,
    slo: dict[str, float] | None,
    cost: CostConfig,
    source: str = "measured",
) -> dict[str, Any]:
    """The point's cost fields (see the module docstring); `cost_source` says whether the timings were measured
    or simulated (`bench simulate`)."""
    goodput = good_output_tokens(records, slo) / max(duration, 1e-9)
    per_million = cost.cost_per_hour / (3600.0 * goodput) * 1e6 if goodput > 0 else None
    return {
        "cost_per_hour": cost.cost_per_hour,
        "gpus_per_instance": cost.gpus_per_instance,
        "goodput_output_throughput": goodput,
        "cost_per_million_output_tokens": per_million,
        "cost_source": source,
    }
