"""Cancellations under load (`bench sweep --cancel-rate P --cancel-after WHEN`), as AIPerf's request cancellation.

A seeded share P of each point's requests is chosen (exactly round(P * n) of its n prompts, the same choice for
the same `--seed`); the client aborts each chosen request mid-stream by closing its connection, either a time
after it was sent (`2s`, `500ms`, `1.5s`) or once it has received a number of output tokens (`16tok`). The
server sees the disconnect and should stop generating, so the other requests' latencies show how it recovers.

A request that ends before its cancel point is recorded as it ended (a normal completion or failure); one that is
aborted gets `cancelled: true` (neither a success nor a failure) and counts in the point's `cancelled` field, not
in its latency statistics or `slo_attainment` (see sweep.point.benchmark_metrics).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

CANCEL_AFTER_SYNTAX = "a time (2s, 500ms) or an output-token count (16tok)"
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*(ms|s|tok)\s*$")


@dataclass(frozen=True)
class CancelAfter:
    """When the client aborts a chosen request: `seconds` after its send, or after `tokens` output tokens."""

    seconds: float | None = None
    tokens: int | None = None

    def __post_init__(self) -> None:
        if (self.seconds is None) == (self.tokens is None):
            raise ValueError("--cancel-after is either a time or a token count")
        if self.seconds is not None and not self.seconds > 0:
            raise ValueError(f"--cancel-after must be a positive time, got {self.seconds} s")
        if self.tokens is not None and self.tokens < 1:
            raise ValueError(f"--cancel-after must be at least 1 token, got {self.tokens}")

    def describe(self) -> str:
        return f"{self.seconds:g}s" if self.seconds is not None else f"{self.tokens}tok"


def parse_cancel_after(text: str) -> CancelAfter:
    """`2s`, `500ms`, `0.25s` (after the send) or `16tok` (after that many output tokens); anything else raises."""
    match = _PATTERN.match(text)
    if match is None:
        raise ValueError(f"--cancel-after takes {CANCEL_AFTER_SYNTAX}, got {text!r}")
    number, unit = match.groups()
    if unit == "tok":
        if "." in number:
            raise ValueError(f"--cancel-after takes a whole number of tokens, got {text!r}")
        return CancelAfter(tokens=int(number))
    return CancelAfter(seconds=float(number) / (1000.0 if unit == "ms" else 1.0))


@dataclass(frozen=True)
class CancelConfig:
    """`--cancel-rate` (share of requests, 0..1) and `--cancel-after`; rate 0 cancels nothing."""

    rate: float = 0.0
    after: CancelAfter | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"--cancel-rate must be in [0, 1], got {self.rate}")
        if self.rate > 0 and self.after is None:
            raise ValueError("--cancel-rate needs --cancel-after (a time like 2s or 500ms, or a count like 16tok)")
        if self.rate == 0 and self.after is not None:
            raise ValueError("--cancel-after needs a --cancel-rate above 0")

    @property
    def active(self) -> bool:
        return self.rate > 0

    def record(self) -> dict[str, Any]:
        """config.json's `sweep.cancel_rate` / `sweep.cancel_after`."""
        return {"cancel_rate": self.rate, "cancel_after": self.after.describe() if self.after else None}


def choose_cancelled(n: int, rate: float, seed: int) -> set[int]:
    """Positions (0..n-1) of the requests to cancel: exactly round(rate * n), drawn without replacement."""
    count = min(n, round(rate * n))
    if count == 0:
        return set()
    rng = np.random.default_rng([seed, 0xCA9CE1])
    return {int(i) for i in rng.choice(n, size=count, replace=False)}


def mark_cancellations(prompts: Sequence[Any], config: CancelConfig, seed: int) -> None:
    """Set `cancel_after` on the chosen prompts (sweep.point.client.PromptRequest), in place."""
    if not config.active:
        return
    for position in choose_cancelled(len(prompts), config.rate, seed):
        prompts[position].cancel_after = config.after
