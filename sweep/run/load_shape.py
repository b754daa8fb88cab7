"""`LoadShape`: the load-shape flags `bench sweep` and `bench tune` share, and what they become in a `SweepConfig`.

Multi-turn sessions (`--turns`, `--think-time`, `--conversations`), trace replay (`--replay`, `--time-scale`),
rate curves (`--ramp-up-strategy/--ramp-up-start-rps/--ramp-up-end-rps`, `--rate-curve`) and structured outputs
(`--structured-output`, `--structured-output-shape`). The flags themselves are declared once, in
`sweep.cli_options.SHARED_OPTIONS`; `SweepConfig` checks how they combine with the rest of the sweep.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

# field -> its flag, in --help order
SHAPE_FLAGS = {
    "replay": "--replay",
    "time_scale": "--time-scale",
    "ramp_up_strategy": "--ramp-up-strategy",
    "ramp_up_start_rps": "--ramp-up-start-rps",
    "ramp_up_end_rps": "--ramp-up-end-rps",
    "rate_curve": "--rate-curve",
    "turns": "--turns",
    "think_time": "--think-time",
    "conversations": "--conversations",
    "structured_output": "--structured-output",
    "structured_output_shape": "--structured-output-shape",
}


@dataclass(frozen=True)
class LoadShape:
    """The load-shape flags as given (the defaults are the plain shape: no sessions, replay, curve or schema)."""

    replay: bool = False
    time_scale: str = "1"
    ramp_up_strategy: str | None = None
    ramp_up_start_rps: float | None = None
    ramp_up_end_rps: float | None = None
    rate_curve: str | None = None
    turns: int = 1
    think_time: float = 0.0
    conversations: Path | None = None
    structured_output: str | None = None
    structured_output_shape: str | None = None

    def given(self) -> list[str]:
        """The flags given with a value other than their default, in --help order."""
        plain = LoadShape()
        return [SHAPE_FLAGS[f.name] for f in fields(self) if getattr(self, f.name) != getattr(plain, f.name)]

    @property
    def sessions(self) -> bool:
        return self.turns > 1 or self.conversations is not None

    def ramp(self, concurrency: object = None, request_rate: object = None) -> tuple[str, float, float] | None:
        """The ramp-up (strategy, start rps, end rps), or None; a ValueError when it is given with a
        `concurrency`, `request_rate` or --replay, or without both rates. A ramp is one open-loop point whose rate
        ramps (vLLM's --ramp-up-strategy)."""
        if self.ramp_up_strategy is None:
            return None
        if request_rate is not None or concurrency is not None or self.replay:
            raise ValueError(
                "--ramp-up-strategy replaces --request-rate (as in vLLM); drop --request-rate/--concurrency/--replay"
            )
        if self.ramp_up_start_rps is None or self.ramp_up_end_rps is None:
            raise ValueError("--ramp-up-strategy needs --ramp-up-start-rps and --ramp-up-end-rps")
        return self.ramp_up_strategy, self.ramp_up_start_rps, self.ramp_up_end_rps

    def workload_fields(self) -> dict[str, Any]:
        """The WorkloadConfig fields these flags set."""
        return {
            "structured_output": self.structured_output,
            "structured_output_shape": self.structured_output_shape,
            "conversations": str(self.conversations) if self.conversations is not None else None,
        }

    def sweep_fields(self) -> dict[str, Any]:
        """The SweepConfig fields these flags set (the load mode and values are the caller's); a bad ramp-up or
        --rate-curve raises ValueError."""
        from workloads.rate_curve import parse_rate_curve

        return {
            "ramp_up": self.ramp(),
            "turns": self.turns,
            "think_time_s": self.think_time,
            "rate_curve": parse_rate_curve(self.rate_curve) if self.rate_curve is not None else None,
        }
