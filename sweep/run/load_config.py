"""`LoadConfig`: the load, workload and SLO of a run, declared and validated once.

The base of `SweepConfig` (sweep/run/sweep_config.py) and `SimulateConfig` (sweep/simulate/simulation.py): what
both are asked to send (the load mode and its values, how many requests or how long, the arrival shape), what
(the workload) and what counts as good (the SLO, the percentiles, the `--max-load-under-slo` search). Its fields
are keyword-only, so a subclass's own fields keep their positions (`SweepConfig(output_dir, ...)`).
`sweep.cli_options.with_load_options` declares the flags that fill it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from sweep.point.benchmark_metrics import DEFAULT_PERCENTILES
from sweep.point.runner import PointSpec, WorkloadConfig
from sweep.run import results

DEFAULT_NUM_PROMPTS = 200  # requests per point when neither num_prompts nor duration is given


def _either(names: tuple[str, ...]) -> str:
    quoted = [repr(n) for n in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


@dataclass(kw_only=True)
class LoadConfig:
    MODES: ClassVar[tuple[str, ...]] = ("concurrency", "rate")  # a subclass may offer more (SweepConfig: replay)

    mode: str = "concurrency"  # "concurrency" (closed loop) | "rate" (open loop) | "replay" (trace timestamps)
    values: list[float] = field(default_factory=lambda: [1.0])  # streams, req/s or replay time scales per point
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    num_prompts: int | None = None  # None with no duration: DEFAULT_NUM_PROMPTS
    duration: float | None = None
    burstiness: float = 1.0
    max_concurrency: int | None = None  # rate mode: optional cap on in-flight requests
    slo: dict[str, float] | None = None
    percentiles: list[float] = field(default_factory=lambda: list(DEFAULT_PERCENTILES))
    max_load_under_slo: bool = False
    attainment: float = 0.9
    max_load: float = 4096.0  # the search never goes above this load

    def __post_init__(self) -> None:
        if self.mode not in self.MODES:
            raise ValueError(f"mode must be {_either(self.MODES)}, got {self.mode!r}")
        if self.mode == "replay" and (self.max_load_under_slo or any(not v > 0 for v in self.values)):
            raise ValueError("--replay takes positive --time-scale values and no --max-load-under-slo")
        if not self.values:
            raise ValueError("give at least one load: --concurrency 1,2,4 or --request-rate 1,2,4")
        if self.mode == "concurrency" and any(v < 1 or v != int(v) for v in self.values):
            raise ValueError(f"concurrencies must be positive integers, got {self.values}")
        if self.mode == "rate" and any(not v > 0 for v in self.values):
            raise ValueError(f"request rates must be > 0, got {self.values}")
        if self.max_load_under_slo and not self.slo:
            raise ValueError("--max-load-under-slo needs an --slo, e.g. --slo ttft=500,tpot=50")
        if self.num_prompts is None and self.duration is None:
            self.num_prompts = DEFAULT_NUM_PROMPTS
        if not self.percentiles or any(not 0 < p <= 100 for p in self.percentiles):
            raise ValueError(f"percentiles must be in (0, 100], got {self.percentiles}")

    def label(self, value: float) -> str:
        """The point's label (its file name in the run directory) for one load value."""
        if self.mode == "replay":
            from workloads.replay import replay_label

            return replay_label(value)
        return results.concurrency_label(int(value)) if self.mode == "concurrency" else results.rate_label(value)

    def point_spec(self, value: float, **spec_fields: Any) -> PointSpec:
        """The point of one concurrency or request rate (rates to the label's 0.01 req/s), plus `spec_fields`."""
        return PointSpec(
            label=self.label(value),
            mode=self.mode,
            concurrency=int(value) if self.mode == "concurrency" else self.max_concurrency,
            rate=round(value, 2) if self.mode == "rate" else math.inf,
            burstiness=self.burstiness,
            num_prompts=self.num_prompts,
            duration=self.duration,
            **spec_fields,
        )

    def load_fields(self) -> dict[str, Any]:
        """This config's LoadConfig fields as keyword arguments (to build another LoadConfig subclass from it)."""
        return {f.name: getattr(self, f.name) for f in fields(LoadConfig)}

    def sweep_record(self) -> dict[str, Any]:
        """The load's part of config.json's "sweep" section."""
        return {
            "mode": self.mode,
            "values": self.values,
            "num_prompts": self.num_prompts,
            "duration": self.duration,
            "burstiness": self.burstiness,
            "max_concurrency": self.max_concurrency,
            "max_load_under_slo": self.max_load_under_slo,
            "attainment": self.attainment,
        }
