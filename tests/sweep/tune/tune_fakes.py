"""A programmable fake engine backend for the tuner tests (no server, no model)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sweep.tune.objective import Infeasible


class FakeBackend:
    """An engine whose capacity is a function of its knobs: attainment 1.0 up to the capacity, 0.5 above."""

    def __init__(self, capacity: Callable[[dict[str, Any]], float], cannot_start: Callable[[dict[str, Any]], bool]
                 = lambda knobs: False) -> None:
        self.capacity, self.cannot_start = capacity, cannot_start
        self.launched: list[dict[str, Any]] = []
        self.measured: list[float] = []

    @contextlib.contextmanager
    def launch(self, knobs: dict[str, Any], trial_dir: Path) -> Iterator[Callable[[int], Any]]:
        self.launched.append(knobs)
        if self.cannot_start(knobs):
            raise Infeasible("engine exited with code 1 before becoming healthy: CUDA out of memory")
        cap = self.capacity(knobs)

        def for_repeat(repeat: int) -> Callable[[float], dict[str, Any]]:
            def measure(load: float) -> dict[str, Any]:
                self.measured.append(load)
                attained = 1.0 if load <= cap else 0.5
                return {"label": f"c{int(load):04d}", "max_concurrency": int(load), "slo_attainment": attained,
                        "request_goodput": min(load, cap) + repeat, "p90_ttft_ms": 10.0 * load, "completed": 8}
            return measure

        yield for_repeat
