"""Dollars per million output tokens at a point's goodput: what serving a workload under its SLO costs.

Only good requests' tokens count (vLLM's goodput test: succeeded and met every SLO given; without an SLO every
successful request is good), so a point that answers fast but misses its SLO is expensive, and one with no good
request has no finite cost (None). The price `cost_per_hour` (USD) is that of one instance of `gpus_per_instance`
GPUs; a configuration pays for the devices it occupies (`occupied_devices`):

    devices_used = tensor_parallel_size * pipeline_parallel_size * data_parallel_size   (GPU; None: unknown or CPU)
    instances_used = devices_used / gpus_per_instance             when devices_used <= gpus_per_instance
                   = ceil(devices_used / gpus_per_instance)       when it spans instances (whole ones)
                   = 1                                            when devices_used is None (the whole instance)
    configuration_cost_per_hour = cost_per_hour * instances_used
    goodput_output_throughput = output tokens of good requests / duration            (tokens/s)
    cost_per_million_output_tokens = configuration_cost_per_hour / (3600 * goodput_output_throughput) * 1e6

On the CPU, tensor-parallel ranks are processes sharing one machine's cores, so a configuration occupies the whole
instance whatever its ranks (devices_used None); a target reached by URL has no known knobs and is priced the same.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sweep.point.benchmark_metrics import is_good
from sweep.point.records import RequestRecord

# The engine knobs (vLLM's names) whose product is the number of devices a configuration's ranks occupy.
PARALLEL_KNOBS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")


@dataclass(frozen=True)
class CostConfig:
    cost_per_hour: float  # USD per instance-hour
    gpus_per_instance: int = 1

    def __post_init__(self) -> None:
        if not (self.cost_per_hour > 0 and math.isfinite(self.cost_per_hour)):
            raise ValueError(f"--cost-per-hour must be a positive number of USD, got {self.cost_per_hour}")
        if self.gpus_per_instance < 1:
            raise ValueError(f"--gpus-per-instance must be >= 1, got {self.gpus_per_instance}")

    def instances_used(self, devices_used: int | None) -> float:
        """The instances a configuration on `devices_used` GPUs pays for (the module docstring)."""
        if devices_used is None:
            return 1.0
        if devices_used <= self.gpus_per_instance:
            return devices_used / self.gpus_per_instance
        return float(math.ceil(devices_used / self.gpus_per_instance))


def occupied_devices(knobs: Mapping[str, Any], device: str | None = None) -> int | None:
    """The GPUs a configuration with these engine knobs occupies: the product of its parallel sizes (1 each when
    unset). None on the CPU (ranks share the machine's cores: the whole instance). `device` defaults to the knobs'
    `device`, else where `auto` resolves on this machine (cuda when torch sees a GPU)."""
    if device is None:
        device = str(knobs.get("device") or "auto")
        if device == "auto":
            from engine.config_checks import resolved_device_type

            device = resolved_device_type("auto")
    if device != "cuda":
        return None
    return math.prod(int(knobs.get(name) or 1) for name in PARALLEL_KNOBS)


def good_output_tokens(records: Sequence[RequestRecord], slo: dict[str, float] | None) -> int:
    return sum(r.output_tokens or 0 for r in records if (is_good(r, slo) if slo else r.success))


def cost_fields(
    records: Sequence[RequestRecord],
    duration: float,
    slo: dict[str, float] | None,
    cost: CostConfig,
    source: str = "measured",
    devices_used: int | None = None,
) -> dict[str, Any]:
    """The point's cost fields (see the module docstring) for a configuration on `devices_used` GPUs (None: the
    whole instance); `cost_source` says whether the timings were measured or simulated (`bench simulate`)."""
    goodput = good_output_tokens(records, slo) / max(duration, 1e-9)
    instances = cost.instances_used(devices_used)
    hourly = cost.cost_per_hour * instances
    per_million = hourly / (3600.0 * goodput) * 1e6 if goodput > 0 else None
    return {
        "cost_per_hour": cost.cost_per_hour,
        "gpus_per_instance": cost.gpus_per_instance,
        "devices_used": devices_used,
        "instances_used": instances,
        "configuration_cost_per_hour": hourly,
        "goodput_output_throughput": goodput,
        "cost_per_million_output_tokens": per_million,
        "cost_source": source,
    }
