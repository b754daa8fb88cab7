"""The records every workloads module passes around, and the one error type for bad input files."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(slots=True)
class RequestSpec:
    """One request to send: token counts, and where the source has them, arrival time and prefix structure.

    Token counts are the source's own: a trace measured with another tokenizer keeps its counts and they
    are used as request sizes for the target model (re-tokenising text we do not have is impossible).
    """

    input_len: int
    output_len: int
    timestamp: float | None = None  # seconds from the trace's start, when the source has real arrivals
    prefix_ids: list[int] | None = None  # Mooncake-style hash ids, one per block of prefix_block_size tokens
    prefix_group: int | None = None  # shared-system-prompt group id
    schema: dict | None = None  # JSON schema (structured-output workload)
    prefix_len: int | None = None  # tokens of the group's shared prefix (with prefix_group)
    prefix_block_size: int | None = None  # tokens per hash id in the source (Mooncake: 512)
    request_class: str | None = None  # e.g. "interactive" / "batch": a trace's class field, a mixture's component


@dataclass
class WorkloadInfo:
    """One line of `bench workloads list`."""

    name: str
    source: str
    licence: str
    count: int
    input_p50: float
    input_p90: float
    output_p50: float
    output_p90: float
    has_timestamps: bool
    has_prefix_ids: bool
    description: str = ""


@dataclass
class FitReport:
    """How fitting a workload to max_model_len changed it (policy clip, drop or rescale)."""

    policy: str
    max_model_len: int
    total: int
    kept: int
    changed: int  # requests whose input or output length was changed (clip, rescale)
    dropped: int  # requests removed (drop)
    input_changed: int = 0
    output_changed: int = 0

    def summary(self) -> str:
        return (
            f"fit {self.total} requests to max_model_len={self.max_model_len} with policy {self.policy!r}: "
            f"{self.changed} changed, {self.dropped} dropped, {self.kept} kept"
        )


@dataclass
class SynthesizedPrompt:
    """A request ready to send: exactly `input_len` prompt tokens as counted by the target tokenizer."""

    prompt: str | None  # /v1/completions
    messages: list[dict] | None  # /v1/chat/completions
    input_len: int
    output_len: int
    timestamp: float | None = None
    schema: dict | None = None
    prefix_group: int | None = None
    extra: dict = field(default_factory=dict)
    request_class: str | None = None


class WorkloadFormatError(ValueError):
    """A malformed input file; the message names the file, the row and the problem."""

    def __init__(self, path: str | Path, row: int | None, problem: str, line: int | None = None) -> None:
        self.path = str(path)
        self.row = row
        self.problem = problem
        where = self.path
        if row is not None:
            where += f": row {row}" + (f" (line {line})" if line is not None and line != row else "")
        super().__init__(f"{where}: {problem}")
