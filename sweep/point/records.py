"""One request's measurements, and its row in `requests.jsonl` (the results contract's field names).

No network code here: reports and the gate rebuild these records from stored rows without importing the client.
Timestamps are `time.perf_counter()` seconds (see `sweep.point.client`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class RequestRecord:
    """Everything measured for one request; field names are the results contract's."""

    index: int
    requested_input_len: int
    requested_output_len: int
    intended_send_time: float
    send_time: float = 0.0
    sent: bool = True  # False: due, but still waiting for a concurrency slot when --duration ended
    success: bool = False
    cancelled: bool = False  # aborted mid-stream by the client (`--cancel-rate`): neither a success nor a failure
    error: str | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    end_time: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    prompt_tokens: int | None = None  # usage, else the client's count
    output_tokens: int | None = None  # usage, else the client's count
    usage_prompt_tokens: int | None = None
    usage_output_tokens: int | None = None
    client_prompt_tokens: int | None = None
    client_output_tokens: int | None = None
    server_timing: dict | None = None
    session: int | None = None  # multi-turn (sweep.point.sessions): the conversation and the turn in it
    turn: int | None = None
    output_valid: bool | None = None  # structured output: parsed and validated (None: unconstrained or failed)
    request_class: str | None = None  # the workload's class of the request (per-class SLOs), None: unclassed
    generated_text: str = ""  # kept in memory for re-tokenising, not written
    in_window: bool | None = None  # with a steady-state window: inside it (sweep.point.steady_state); else None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.send_time

    @property
    def e2el(self) -> float | None:
        return None if self.last_token_time is None else self.last_token_time - self.send_time

    @property
    def itl(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times[:-1], self.chunk_times[1:], strict=True)]

    def to_row(self, label: str) -> dict[str, Any]:
        """The request's `requests.jsonl` row: the stored fields, the point's label and the derived latencies."""
        row = asdict(self)
        del row["generated_text"], row["usage_prompt_tokens"], row["usage_output_tokens"]
        row.update(label=label, ttft=self.ttft, e2el=self.e2el, itl=self.itl)
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> RequestRecord:
        """The record back from its `requests.jsonl` row (derived and per-run fields are dropped)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in row.items() if k in names})
