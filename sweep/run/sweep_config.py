"""`SweepConfig`: everything one `bench sweep` is asked to do, validated on construction.

The load, workload and SLO fields and their checks are `LoadConfig`'s (sweep/run/load_config.py), shared with
`bench simulate`; the sweep adds the target, the replay mode and how points are measured."""

from __future__ import annotations

import shlex
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from sweep.point.cancel import CancelConfig
from sweep.point.client import REQUEST_TIMEOUT_S, STALL_TIMEOUT_S
from sweep.point.saturation import SaturationConfig
from sweep.run.load_config import LoadConfig
from sweep.run.search import DEFAULT_CONFIDENCE, check_confidence


@dataclass
class SweepConfig(LoadConfig):
    MODES: ClassVar[tuple[str, ...]] = ("concurrency", "rate", "replay")

    output_dir: Path
    url: str | None = None  # None: launch the built-in engine
    model: str = "smollm2-135m"
    tokenizer: str | None = None  # default: the model
    api_key: str | None = None
    ignore_eos: bool = True
    temperature: float | None = None
    engine_knobs: dict[str, Any] = field(default_factory=dict)
    launch_template: str | None = None  # an external server's command template (see launcher.py)
    weights: dict[str, Any] | None = None  # what the server loads, when its caller knows (bench compare's targets)
    num_warmups: int = 0
    reset_prefix_cache: bool = False
    search_repeats: int = 0  # --max-load-under-slo: at most this many more measurements of an uncertain probe
    confidence: float = DEFAULT_CONFIDENCE  # --max-load-under-slo: each probe's interval level (sweep/run/search.py)
    resume: bool = False
    client_procs: int = 1
    repeats: int = 1  # see sweep/run/repeats.py
    calibration: bool = False  # record sweep/mock/machine_speed.py's figures in config.json (on in `bench sweep`)
    server_metrics: bool = True  # scrape the target's /metrics over each point (sweep.point.server_metrics)
    ramp_up: tuple[str, float, float] | None = None  # vLLM's --ramp-up-strategy/-start-rps/-end-rps: one rate point
    turns: int = 1  # > 1: multi-turn sessions (sweep.point.sessions), chat endpoint only
    think_time_s: float = 0.0
    rate_curve: list[float] | None = None  # --rate-curve: window rates shaping every rate point (workloads.rate_curve)
    warmup_seconds: float = 0.0  # steady window (sweep.point.steady_state): the figures leave out the ramp-up
    cooldown_seconds: float = 0.0  # ... and the drain
    steady_window: str | None = None  # "auto": detect the window (sweep.point.steady_state.auto_window)
    cancel: CancelConfig = field(default_factory=CancelConfig)  # --cancel-rate/--cancel-after (sweep.point.cancel)
    health_timeout_s: float = 600.0
    health_path: str = "/health"  # a launched server without /health (llama.cpp's) is ready once this answers 200
    request_timeout_s: float | None = REQUEST_TIMEOUT_S  # a request running longer fails with "Timeout"; 0/None: off
    stall_timeout_s: float | None = STALL_TIMEOUT_S  # a stream silent this long fails with "Stalled"; 0/None: off
    cost_per_hour: float | None = None  # USD per instance-hour: points get cost_per_million_output_tokens
    gpus_per_instance: int = 1
    devices_used: int | None = None  # a --url target's GPUs, when its caller knows them (sweep/run/cost.py)
    saturation: SaturationConfig = field(default_factory=SaturationConfig)  # rate points; .stop: --stop-when-saturated
    command: str = field(default_factory=lambda: shlex.join(["bench", *sys.argv[1:]]))

    def __post_init__(self) -> None:
        super().__post_init__()
        self.output_dir = Path(self.output_dir)
        if self.repeats < 1:
            raise ValueError(f"--repeats must be >= 1, got {self.repeats}")
        check_confidence(self.confidence)
        if self.ramp_up is not None and (self.mode != "rate" or self.values != [self.ramp_up[2]]):
            raise ValueError("a ramp-up is one rate point: mode 'rate' with values [end rps]")
        sessions = self.turns > 1 or self.workload.conversations is not None
        if sessions and (self.workload.endpoint != "chat" or self.client_procs > 1 or self.mode == "replay"):
            flag = "--conversations" if self.workload.conversations is not None else "--turns"
            raise ValueError(
                f"{flag} needs --endpoint chat (the history is a message list), one client process and no --replay"
            )
        if self.mode == "replay":
            from workloads import is_text_workload

            if is_text_workload(self.workload.workload):
                raise ValueError(
                    f"--replay needs a workload with timestamps; {self.workload.workload!r} is prompt text, which has "
                    "none: sweep it with --concurrency or --request-rate, or replay a trace"
                )
        if self.turns > 1 and self.workload.conversations is not None:
            raise ValueError("--conversations takes each session's turns from the file; drop --turns")
        if self.rate_curve is not None:
            from workloads.rate_curve import check_rate_curve

            check_rate_curve(self.rate_curve)
            if self.mode != "rate" or self.ramp_up is not None:
                raise ValueError(
                    "--rate-curve shapes --request-rate points; drop --concurrency, --replay and --ramp-up-strategy"
                )
        if self.search_repeats < 0:
            raise ValueError(f"--search-repeats must be >= 0, got {self.search_repeats}")
        if not self.max_load_under_slo and (self.search_repeats or self.confidence != DEFAULT_CONFIDENCE):
            raise ValueError("--search-repeats and --confidence shape the --max-load-under-slo search; add that flag "
                             "or drop them")
        if self.warmup_seconds < 0 or self.cooldown_seconds < 0:
            raise ValueError(
                f"--warmup-seconds and --cooldown-seconds must be >= 0, got {self.warmup_seconds}, "
                f"{self.cooldown_seconds}"
            )
        if self.steady_window not in (None, "auto"):
            raise ValueError(f"--steady-window takes 'auto', got {self.steady_window!r}")
        if self.steady_window == "auto" and (self.warmup_seconds or self.cooldown_seconds):
            raise ValueError("--steady-window auto detects the window; drop --warmup-seconds/--cooldown-seconds")
        if self.cancel.active and sessions:
            raise ValueError("--cancel-rate cancels single requests; it does not combine with --turns/--conversations")
        for flag, name in (("--request-timeout", "request_timeout_s"), ("--stall-timeout", "stall_timeout_s")):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{flag} must be >= 0 (0: no limit), got {value}")
            setattr(self, name, value or None)
        if self.client_procs < 1:
            raise ValueError(f"--client-procs must be >= 1, got {self.client_procs}")
        if self.saturation.stop:
            self.check_stop_when_saturated()
        if self.cost_per_hour is not None:
            from sweep.run.cost import CostConfig

            CostConfig(self.cost_per_hour, self.gpus_per_instance)  # a bad price fails before any point runs

    def check_stop_when_saturated(self) -> None:
        """--stop-when-saturated judges constant-rate open-loop points (sweep.point.saturation.applies)."""
        sessions = self.turns > 1 or self.workload.conversations is not None
        if self.mode != "rate" or self.ramp_up is not None or self.rate_curve is not None or sessions:
            raise ValueError(
                "--stop-when-saturated applies to --request-rate points at a constant rate; a closed loop "
                "(--concurrency) cannot over-saturate, and --replay, --ramp-up-strategy, --rate-curve and "
                "multi-turn sessions vary their load by design"
            )
        if any(v == float("inf") for v in self.values):
            raise ValueError("--stop-when-saturated needs finite --request-rate values (inf is a closed loop)")
        if self.client_procs > 1 or self.repeats > 1:
            raise ValueError("--stop-when-saturated runs with one client process and without --repeats")

    def label(self, value: float) -> str:
        if self.ramp_up is not None:
            strategy, start, end = self.ramp_up
            return f"ramp-{strategy}-{start:g}-{end:g}"
        return super().label(value)

    def measurement_record(self) -> dict[str, Any]:
        """What config.json's `sweep` section adds to the loads' `sweep_record()`: how every point was measured."""
        return {
            "num_warmups": self.num_warmups,
            "reset_prefix_cache": self.reset_prefix_cache,
            "search_repeats": self.search_repeats,
            "confidence": self.confidence,
            "client_procs": self.client_procs,
            "repeats": self.repeats,
            "server_metrics": self.server_metrics,
            "warmup_seconds": self.warmup_seconds,
            "cooldown_seconds": self.cooldown_seconds,
            "steady_window": self.steady_window,
            **self.cancel.record(),
            "ramp_up": self.ramp_up,
            "turns": self.turns,
            "think_time_s": self.think_time_s,
            "rate_curve": self.rate_curve,
            "ignore_eos": self.ignore_eos,
            "temperature": self.temperature,
            "request_timeout_s": self.request_timeout_s,
            "stall_timeout_s": self.stall_timeout_s,
            "stop_when_saturated": self.saturation.stop,
            "saturation": asdict(self.saturation),
        }
