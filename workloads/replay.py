"""Trace replay (`bench sweep --workload TRACE --replay --time-scale 1,0.5`): each request at its trace timestamp.

A point replays the trace from its first request, in trace order: request i is due at
(timestamp_i - timestamp_0) * time_scale after the point's start (2 = half speed, 0.5 = double speed;
`workloads.arrivals.replay`). `--num-prompts N` takes the first N requests of the trace (a contiguous window, so
the arrival process is the trace's own, not a thinned sample); `--duration S` takes those due before S. The
offered rate of the point is its requests over the replayed span. Requests are sent at their due times whatever
the server does (an open loop; `--max-concurrency` adds a cap), the send lag is recorded in the point's
`fidelity.client.send_lag`, and a request still waiting for a slot when the point ends is recorded as not sent.
Sources with timestamps: the shipped Azure 2023 and Mooncake mixes, and Azure, Mooncake, BurstGPT and generic
CSV/JSONL trace files with a timestamp column.
"""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import Any

from workloads.spec import FitReport, RequestSpec, SynthesizedPrompt


def replay_label(time_scale: float) -> str:
    return f"t{time_scale:07.3f}"


def require_timestamps(name: str, specs: list[RequestSpec]) -> None:
    """A ValueError unless every request of workload `name` has its timestamp (what --replay sends it at)."""
    if not specs or any(s.timestamp is None for s in specs):
        raise ValueError(
            f"--replay needs a workload with timestamps; {name!r} has none "
            "(traces with them: azure-code-2023, azure-conv-2023, mooncake-conversation, or a trace file)"
        )


def replay_requests(
    name: str,
    tokenizer: Any,
    time_scale: float,
    num_prompts: int | None,
    duration: float | None,
    seed: int,
    endpoint: str,
    salt: str,
    max_model_len: int | None = None,
    fit_policy: str = "clip",
) -> tuple[list[RequestSpec], list[SynthesizedPrompt], FitReport | None, list[float]]:
    """(specs, prompts, fit report, send offsets) of trace `name`'s first requests, replayed at `time_scale`."""
    import workloads

    is_file = name not in workloads.shipped_names() and Path(name).expanduser().is_file()
    specs = workloads.load(
        name,
        num_requests=None,  # the whole trace in order; the point takes a window from its start
        seed=seed,
        max_model_len=max_model_len,
        fit_policy=fit_policy,
        **({"tokenizer": tokenizer} if is_file else {}),
    )
    fit_report = workloads.last_fit_report() if hasattr(workloads, "last_fit_report") else None
    require_timestamps(name, specs)
    offsets = workloads.arrivals.replay([s.timestamp for s in specs], time_scale=time_scale)
    count = len(specs)
    if num_prompts is not None:
        count = min(count, num_prompts)
    if duration is not None:
        count = min(count, bisect.bisect_left(offsets, duration))
    count = max(count, 1)
    specs, offsets = specs[:count], offsets[:count]
    synthesized = workloads.synthesize(specs, tokenizer, endpoint=endpoint, seed=seed, salt=salt)
    return specs, synthesized, fit_report, offsets


def offered_rate(offsets: list[float]) -> float:
    """Requests per second over the replayed span: n - 1 gaps from the first request (at 0) to the last."""
    span = offsets[-1] if offsets else 0.0
    return (len(offsets) - 1) / span if span > 0 else float("inf")
