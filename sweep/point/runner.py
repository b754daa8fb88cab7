"""One sweep point: build its prompts, run warm-ups, send on an absolute schedule, resolve token counts.

Closed loop (`concurrency`): every request is due at t0 (vLLM's rate=inf) and a semaphore keeps at most
`concurrency` in flight. Open loop (`rate`): send offsets come from `workloads.arrivals` (gamma with
`burstiness`, 1 = Poisson), slept to as absolute deadlines so the offered rate cannot drift (vllm#21104);
an optional `max_concurrency` caps in-flight requests. As in vLLM, the schedule is rescaled so its mean rate is
exactly the offered rate. With `duration`, nothing is sent after t0 + duration
(in-flight requests finish and count). Warm-up prompts are synthesized with their own seed and salt, so they
cannot seed the prefix cache for measured prompts, and are never recorded.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

from sweep.point.cancel import CancelConfig, mark_cancellations
from sweep.point.client import (
    ClientConfig,
    PromptRequest,
    count_tokens,
    make_session,
    preconnect,
    reset_prefix_cache,
    send_request,
)
from sweep.point.prompts import build_prompts, check_outputs, replay_prompts, tag_classes
from sweep.point.records import RequestRecord
from sweep.point.saturation import SaturationConfig, applies
from sweep.point.server_metrics import ServerMetricsSampler

START_DELAY_S = 0.05  # first send a little in the future, so every task is waiting on the same deadline
RAMP_STRATEGIES = ("linear", "exponential")


@dataclass
class WorkloadConfig:
    """The workload flags; passed to `workloads.load` unchanged."""

    workload: str = "random"
    input_len: int | None = None  # fixed/random only (workloads' defaults: 1024 and 128)
    output_len: int | None = None
    range_ratio: float = 0.0
    max_model_len: int | None = None
    fit_policy: str = "clip"
    seed: int = 0
    endpoint: str = "completions"
    structured_output: str | None = None  # json | regex | choice on every request (workloads/structured.py)
    structured_output_shape: str | None = None  # response_format | structured_outputs | guided; None: by kind
    conversations: str | None = None  # a conversation file: sessions are its conversations (sweep.point.sessions)


@dataclass
class PointSpec:
    label: str
    mode: str  # "concurrency" | "rate"
    concurrency: int | None = None  # the cap: closed-loop streams, or an optional ceiling in rate mode
    rate: float = math.inf
    burstiness: float = 1.0
    num_prompts: int | None = None
    duration: float | None = None
    num_warmups: int = 0
    time_scale: float = 1.0  # replay: trace time multiplier (workloads.replay)
    ramp: tuple[str, float, float] | None = None  # rate mode: vLLM's ramp-up (strategy, start rps, end rps)
    turns: int = 1  # > 1: multi-turn sessions (sweep.point.sessions); the load counts sessions
    think_time_s: float = 0.0
    rate_curve: tuple[float, ...] | None = None  # rate mode: window rates shaping the arrivals (workloads.rate_curve)
    cancel: CancelConfig = field(default_factory=CancelConfig)  # --cancel-rate: requests the client aborts

    def __post_init__(self) -> None:
        if self.mode not in ("concurrency", "rate", "replay"):
            raise ValueError(f"mode must be 'concurrency', 'rate' or 'replay', got {self.mode!r}")
        if self.mode == "replay" and not self.time_scale > 0:
            raise ValueError(f"--time-scale must be > 0, got {self.time_scale}")
        if self.mode == "concurrency" and (self.concurrency is None or self.concurrency < 1):
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.mode == "rate" and not self.rate > 0:
            raise ValueError(f"request rate must be > 0, got {self.rate}")
        if self.ramp is not None and (self.ramp[0] not in RAMP_STRATEGIES or not 0 < self.ramp[1] <= self.ramp[2]):
            raise ValueError(
                f"ramp-up needs a strategy in {RAMP_STRATEGIES} and 0 < --ramp-up-start-rps <= --ramp-up-end-rps, "
                f"got {self.ramp}"
            )
        if self.rate_curve is not None:
            from workloads.rate_curve import check_rate_curve

            check_rate_curve(list(self.rate_curve))
            if self.mode != "rate" or self.ramp is not None:
                raise ValueError("--rate-curve shapes --request-rate points (no --ramp-up-strategy)")
        if self.turns < 1 or self.think_time_s < 0:
            raise ValueError(f"--turns must be >= 1 and --think-time >= 0, got {self.turns}, {self.think_time_s}")
        if self.burstiness <= 0:
            raise ValueError(f"burstiness must be > 0, got {self.burstiness}")
        if self.num_prompts is None and self.duration is None and self.mode != "replay":
            raise ValueError("give --num-prompts or --duration for each point")
        if self.num_prompts is not None and self.num_prompts < 1:
            raise ValueError(f"num_prompts must be >= 1, got {self.num_prompts}")
        if self.duration is not None and self.duration <= 0:
            raise ValueError(f"duration must be > 0, got {self.duration}")

    @property
    def pool_size(self) -> int:
        """Prompts to prepare: all of them, or in duration mode enough for the offered load."""
        if self.num_prompts is not None:
            return self.num_prompts
        assert self.duration is not None
        if self.mode == "rate" and math.isfinite(self.rate):
            return max(1, math.ceil(self.rate * self.duration))
        return min(DURATION_POOL_MAX, max(DURATION_POOL_MIN, DURATION_POOL_PER_STREAM * (self.concurrency or 1)))


# Closed loop with only --duration: prompts are synthesized before the point (never while it is measured), so the
# pool is sized up front; the point also ends if it runs out (flagged `pool_exhausted`; pass --num-prompts).
DURATION_POOL_MIN, DURATION_POOL_PER_STREAM, DURATION_POOL_MAX = 200, 20, 2000


@dataclass
class PointRun:
    spec: PointSpec
    records: list[RequestRecord]
    prompts: list[PromptRequest]
    specs: list[Any]  # workloads.RequestSpec, for fidelity
    t0: float
    duration: float
    fit_report: Any = None
    extras: dict[str, Any] = field(default_factory=dict)
    server_metrics: dict[str, Any] | None = None  # sweep.point.server_metrics: /metrics deltas over the point


def send_offsets(spec: PointSpec, n: int, seed: int = 0) -> list[float]:
    """Send times in seconds from t0 on an absolute schedule, as vLLM's `get_request` builds it: n gamma gaps
    (shape `burstiness`, mean 1/rate), the first send one gap after t0, rescaled so the last send is at exactly
    n / rate (no seed-dependent drift of a few percent in the offered rate)."""
    if spec.mode == "concurrency" or (math.isinf(spec.rate) and spec.ramp is None) or n == 0:
        return [0.0] * n
    if spec.rate_curve is not None:  # the curve stretched over the point; not rescaled (its n-th send is random)
        import workloads.arrivals

        return workloads.arrivals.rate_curve(spec.rate_curve, n, spec.rate, spec.duration, spec.burstiness, seed)
    rng = np.random.default_rng(seed)
    if spec.ramp is not None:  # vLLM's ramp-up: gap i drawn at the rate reached at progress i / (n - 1), no rescale
        strategy, start, end = spec.ramp
        progress = np.arange(n) / max(n - 1, 1)
        rates = start + (end - start) * progress if strategy == "linear" else start * (end / start) ** progress
        return np.cumsum(rng.gamma(shape=spec.burstiness, size=n) / (rates * spec.burstiness)).tolist()
    offsets = np.cumsum(rng.gamma(shape=spec.burstiness, scale=1.0 / (spec.rate * spec.burstiness), size=n))
    if offsets[-1] > 0:
        offsets *= n / spec.rate / offsets[-1]
    return offsets.tolist()


def not_sent_records(
    spec: PointSpec, prompts: list[PromptRequest], offsets: list[float], t0: float, records: list[RequestRecord],
    error: str | None = None,
) -> list[RequestRecord]:
    """Open loop: every scheduled request that got no record was due before the end and never sent (it still
    waited for a concurrency slot when --duration ended, or `error` says why). It is recorded, with its due time,
    as not sent."""
    if spec.mode == "concurrency" or (spec.mode == "rate" and math.isinf(spec.rate)):
        return []  # a closed loop's unused pool prompts were never due
    sent = {r.index for r in records}
    return [
        RequestRecord(
            index=p.index,
            requested_input_len=p.input_len,
            requested_output_len=p.output_len,
            intended_send_time=t0 + offset,
            sent=False,
            error=error or "NotSent: due before --duration ended, still waiting for a --max-concurrency slot",
        )
        for p, offset in zip(prompts, offsets, strict=True)
        if p.index not in sent
    ]


def schedule(spec: PointSpec, prompts: list[PromptRequest], seed: int = 0) -> list[float]:
    offsets = send_offsets(spec, len(prompts), seed)
    if spec.duration is not None and spec.mode == "rate":
        kept = [o for o in offsets if o < spec.duration] or offsets[:1]
        del prompts[len(kept) :]
        offsets = kept
    return offsets


async def dispatch(
    session: aiohttp.ClientSession,
    client: ClientConfig,
    prompts: list[PromptRequest],
    offsets: list[float],
    t0: float,
    concurrency: int | None,
    stop_at: float | None,
    on_done: Callable[[], None] | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
    stop: asyncio.Future[None] | None = None,
) -> list[RequestRecord]:
    """Send `prompts[i]` at `t0 + offsets[i]` (later if the concurrency cap is full); skip those not sent by
    `stop_at`. Returns the records of the requests actually sent, in index order. `on_record` sees each record
    as its request ends. Once `stop` is done nothing more is sent and the requests in flight are cancelled
    (`sweep.point.watch.stoppable`)."""
    semaphore = asyncio.Semaphore(concurrency) if concurrency else None
    sent_at: dict[int, float] = {}

    async def one(prompt: PromptRequest, offset: float) -> RequestRecord | None:
        prompt.intended_send_time = t0 + offset
        delay = prompt.intended_send_time - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if semaphore is not None:
            await semaphore.acquire()
        try:
            if (stop_at is not None and time.perf_counter() >= stop_at) or (stop is not None and stop.done()):
                return None
            sent_at[prompt.index] = time.perf_counter()
            record = await send_request(session, client, prompt)
        finally:
            if semaphore is not None:
                semaphore.release()
        if on_record is not None:
            on_record(record)
        if on_done is not None:
            on_done()
        return record

    if stop is not None:
        from sweep.point.watch import stoppable

        one = stoppable(one, stop, sent_at)
    # One sleep to t0 for all: requests due at the same time (a closed loop's first wave) then start, and take the
    # semaphore, in index order, as `bench simulate` sends them. A sleep per request to the same instant would wake
    # them in the timer heap's order, which is arbitrary among equal deadlines.
    start_delay = t0 - time.perf_counter()
    if start_delay > 0:
        await asyncio.sleep(start_delay)
    results = await asyncio.gather(*(one(p, o) for p, o in zip(prompts, offsets, strict=True)))
    return [r for r in results if r is not None]


async def prepare_point(
    session: aiohttp.ClientSession, client: ClientConfig, spec: PointSpec, warmups: list[PromptRequest],
    reset_cache: bool,
) -> dict[str, Any]:
    """Before the measured requests: reset the prefix cache (`prefix_cache_reset`: whether the server did) and
    send the warm-ups at the point's concurrency (`warmup_failed`: how many failed)."""
    extras: dict[str, Any] = {}
    if reset_cache:
        extras["prefix_cache_reset"] = await reset_prefix_cache(session, client)
    if warmups:
        cap = min(spec.concurrency or len(warmups), len(warmups))
        warm = await dispatch(session, client, warmups, [0.0] * len(warmups), time.perf_counter(), cap, None)
        extras["warmup_failed"] = sum(not r.success for r in warm)
    return extras


async def _run_point_async(
    client: ClientConfig,
    spec: PointSpec,
    prompts: list[PromptRequest],
    offsets: list[float],
    warmups: list[PromptRequest],
    reset_cache: bool,
    on_done: Callable[[], None] | None,
    sampler: ServerMetricsSampler | None = None,
    sessions: list[list[PromptRequest]] | None = None,
    live: bool = True,
    saturation: SaturationConfig | None = None,
) -> tuple[list[RequestRecord], float, float, dict[str, Any]]:
    extras: dict[str, Any] = {}
    async with make_session() as session:
        await preconnect(session, client, min(spec.concurrency or len(prompts), len(prompts)))
        extras.update(await prepare_point(session, client, spec, warmups, reset_cache))
        if sampler is not None:
            sampler.begin()
        t0 = time.perf_counter() + START_DELAY_S
        stop_at = t0 + spec.duration if spec.duration is not None else None
        cpu_start = time.process_time()
        if sessions is not None:
            from sweep.point.sessions import dispatch_sessions

            records = await dispatch_sessions(
                session, client, sessions, offsets, t0, spec.concurrency, stop_at, spec.think_time_s, on_done, live
            )
        elif saturation is not None:
            from sweep.point.watch import dispatch_watched

            records, extras["saturation"] = await dispatch_watched(
                session, client, prompts, offsets, t0, spec.concurrency, stop_at, on_done, saturation
            )
        else:
            records = await dispatch(session, client, prompts, offsets, t0, spec.concurrency, stop_at, on_done)
        extras["client_cpu_s"] = time.process_time() - cpu_start
        if sampler is not None:
            extras["server_metrics"] = sampler.end()
    end = max((r.end_time or r.send_time for r in records), default=t0)
    return records, t0, end - t0, extras


def run_point(
    client: ClientConfig,
    spec: PointSpec,
    workload: WorkloadConfig,
    tokenizer: Any,
    salt: str,
    reset_cache: bool = False,
    client_procs: int = 1,
    on_done: Callable[[], None] | None = None,
    server_metrics: bool = False,
    saturation: SaturationConfig | None = None,
) -> PointRun:
    """Prepare, warm up and measure one point; token counts resolved, ready for `calculate_metrics`.
    With `server_metrics`, the target's /metrics is scraped over the point (`sweep.point.server_metrics`).
    With `saturation`, the over-saturation detector watches a point it applies to (`saturation.applies`); its
    result is `extras["saturation"]`, and a point it stopped keeps only the requests due before the stop."""
    sampler = ServerMetricsSampler(client.url, client.api_key) if server_metrics else None
    sessions: list[list[PromptRequest]] | None = None
    live = workload.conversations is None  # sessions: history from the server's replies, else recorded
    if spec.mode == "replay":
        specs, prompts, fit_report, offsets = replay_prompts(
            workload, tokenizer, spec.time_scale, spec.num_prompts, spec.duration, salt=f"{salt}-{spec.label}"
        )
    elif spec.turns > 1 or workload.conversations is not None:
        from sweep.point.sessions import session_prompts

        if client_procs > 1 or spec.cancel.active:
            raise ValueError("multi-turn sessions run in one client process, without --cancel-rate")
        specs, sessions, fit_report = session_prompts(spec, workload, tokenizer, salt=f"{salt}-{spec.label}")
        prompts = [turn for turns in sessions for turn in turns]
        offsets = schedule(spec, [s[0] for s in sessions], workload.seed)
        del sessions[len(offsets) :]
    else:
        specs, prompts, fit_report = build_prompts(workload, tokenizer, spec.pool_size, salt=f"{salt}-{spec.label}")
        offsets = schedule(spec, prompts, workload.seed)
    if sessions is None:
        mark_cancellations(prompts, spec.cancel, workload.seed)  # warm-ups are never cancelled
    warmups: list[PromptRequest] = []
    if spec.num_warmups:
        _, warmups, _ = build_prompts(
            workload, tokenizer, spec.num_warmups, salt=f"{salt}-{spec.label}-warmup", seed_offset=1_000_003
        )
    if sessions is not None or not applies(spec.mode, spec.rate, spec.ramp, spec.rate_curve, spec.turns, client_procs):
        saturation = None
    if client_procs > 1:
        from sweep.point.multiproc import run_point_sharded

        records, t0, duration, extras = run_point_sharded(
            client, spec, prompts, offsets, warmups, reset_cache, client_procs, on_done, sampler
        )
    else:
        records, t0, duration, extras = asyncio.run(
            _run_point_async(
                client, spec, prompts, offsets, warmups, reset_cache, on_done, sampler, sessions, live, saturation
            )
        )
    point_server_metrics = extras.pop("server_metrics", None)
    if sessions is not None:  # the turns as sent (history included); a session never started: its first turn
        prompts = [turn for turns in sessions for turn in turns]
        records += not_sent_records(spec, [turns[0] for turns in sessions], offsets, t0, records)
    elif extras.get("saturation", {}).get("stopped"):
        from sweep.point.watch import stopped_point_records

        prompts, records = stopped_point_records(spec, prompts, offsets, t0, records, extras["saturation"])
    else:
        records += not_sent_records(spec, prompts, offsets, t0, records)
    closed_loop = spec.mode == "concurrency" or (spec.mode == "rate" and math.isinf(spec.rate))
    if closed_loop and spec.duration is not None and spec.num_prompts is None and len(records) == len(prompts):
        extras["pool_exhausted"] = duration < spec.duration  # closed loop ran out of prompts before the end
    by_index = {p.index: p for p in prompts}
    count_tokens(records, tokenizer, by_index)
    check_outputs(records, by_index)
    tag_classes(records, by_index)
    sent = {r.index for r in records}
    if spec.mode == "replay":
        from workloads.replay import offered_rate

        extras["replayed_rate"] = offered_rate(offsets)
    return PointRun(
        spec=spec,
        records=sorted(records, key=lambda r: r.index),
        prompts=[p for p in prompts if p.index in sent],
        specs=[s for i, s in enumerate(specs) if i in sent],
        t0=t0,
        duration=duration,
        fit_report=fit_report,
        extras=extras,
        server_metrics=point_server_metrics,
    )
