"""Point metrics, exactly as vLLM's `calculate_metrics` (vllm/benchmarks/serve.py) defines them.

- TTFT and E2EL over successful requests; E2EL ends at the last token chunk (not the usage chunk or [DONE]).
- TPOT per request = (e2el - ttft) / (output_tokens - 1), only for output_tokens > 1; statistics are
  unweighted over requests.
- ITL = every chunk gap of every successful request, pooled (long outputs dominate; with multi-token
  chunks ITL is a delivery-smoothness measure, not decode speed).
- Throughputs divide by the point's duration (first send to last finish, including ramp and drain).
- Statistics: numpy mean / median / population std / linear-interpolated percentiles; empty lists give 0.
- Goodput (vLLM `--goodput`): a request is good iff it succeeded and every given SLO holds
  (`slo_ms / 1000 >= value`; requests with <= 1 output token have TPOT 0 and pass it); with `valid=1` a
  structured output that did not parse and validate is a miss too. Beyond vLLM, two per-token SLOs on each
  request's own chunk gaps (first token -> second included, TTFT not): `itl_p99` (the request's p99 gap,
  linear-interpolated as numpy) and `max_stall` (its longest gap, what a chat user sees as a freeze); a request
  with <= 1 output chunk has no gap and passes both, as with TPOT.
  `request_goodput` = good / duration; `slo_attainment` = good / (completed + failed), so failures are misses
  (DistServe's attainment; AIPerf's `good_request_fraction`).

Queue-inclusive latency, as vLLM reports it (vllm#54101) and only where it means something, an open loop with a
concurrency cap (`queue_inclusive_applies`): `client_queue_time` (intended send -> actual send) and
`e2el_including_client_queue` (intended send -> last token) over successful requests. In a closed loop every
request is "due" at the start, so the same figures would only measure how long the point ran.

Requests that were due but never sent (still waiting for a slot when `--duration` ended) are records with
`sent = False`: not `completed`, not `failed` (nothing reached the server), counted in `not_sent`, and misses
in `slo_attainment`'s denominator.

Requests the client aborted on purpose (`--cancel-rate`, sweep.point.cancel) are records with `cancelled = True`:
not `completed`, not `failed`, counted in `cancelled`, left out of every latency statistic (TTFT included, even
when a first token arrived) and of `slo_attainment`'s denominator (the client ended them, so they say nothing about
whether the server met the SLO); their tokens are not in the throughputs.

Additions beyond vLLM (all optional fields of the results contract):
- `valid_output_fraction`: of the completed requests that asked for a structured output, the share whose output
  parsed and validated (workloads/structured.py); absent when no request asked for one.
- `max_stall` statistics (`mean_max_stall_ms`, `p99_max_stall_ms`, ...): the distribution over successful
  requests with 2+ chunks of each one's longest chunk gap.
- Per-class SLOs: a request may carry a class (`RequestRecord.request_class`, from the workload); an SLO may give
  each class its own limits (`parse_slo`), and with an SLO the point carries `classes`: per class, `requests`,
  `completed`, `request_goodput` and `slo_attainment`. The overall figures count a request good iff it meets its
  own class's SLO.
- TTFT decomposition from the server's `servelab` timing: `queue_ms` (arrival -> first scheduled),
  `prefill_ms` (first scheduled -> first token) and `ttft_rest_ms` (TTFT minus both: network, HTTP,
  detokenisation and client).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

from sweep.point.records import RequestRecord

SLO_KEYS = ("ttft", "tpot", "e2el", "itl_p99", "max_stall")
VALID_SLO_KEY = "valid"  # `valid=1`: a structured output that did not parse and validate misses the SLO
DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)
SLO_SYNTAX = "ttft=MS,tpot=MS,e2el=MS,itl_p99=MS,max_stall=MS"  # for help texts: every latency SLO key
CLASS_SEP = ":"  # a per-class limit's key: `interactive:ttft_ms`
_CLASS_SECTION = re.compile(r"\s*(?P<name>[A-Za-z0-9_.-]+)\s*:\s*(?P<items>.*)", re.DOTALL)

# Our (vLLM's) names -> the nearest quantity in AIPerf and GuideLLM. Never compare across tools by name alone:
# GuideLLM's "time_per_output_token_ms" includes the first token, and AIPerf's "inter_token_latency" is our TPOT.
NAME_MAP: dict[str, dict[str, str | None]] = {
    "ttft_ms": {"aiperf": "time_to_first_token", "guidellm": "time_to_first_token_ms"},
    "tpot_ms": {"aiperf": "inter_token_latency", "guidellm": "inter_token_latency_ms"},
    "itl_ms": {"aiperf": "inter_chunk_latency", "guidellm": None},
    "e2el_ms": {"aiperf": "request_latency", "guidellm": "request_latency"},
    "request_throughput": {"aiperf": "request_throughput", "guidellm": "requests_per_second"},
    "output_throughput": {"aiperf": "output_token_throughput", "guidellm": "output_tokens_per_second"},
    "total_token_throughput": {"aiperf": "total_token_throughput", "guidellm": "tokens_per_second"},
    "request_goodput": {"aiperf": "goodput", "guidellm": "request_goodput"},
    "slo_attainment": {"aiperf": "good_request_fraction", "guidellm": "slo_attainment"},
}


def percentile_name(p: float) -> str:
    """vLLM's field spelling: 99 -> 'p99', 99.9 -> 'p99.9'."""
    return f"p{int(p)}" if float(p).is_integer() else f"p{p}"


def parse_slo(text: str | None) -> dict[str, float] | None:
    """'ttft=500,tpot=50' (or vLLM's 'ttft:500 tpot:50') -> {'ttft_ms': 500.0, 'tpot_ms': 50.0}.

    Per-class SLOs: ';'-separated sections, each `CLASS:items` ('interactive:ttft=500,tpot=50;batch:e2el=20000')
    or plain items that apply to every class ('e2el=30000;interactive:ttft=500'). A class's limits are stored as
    `CLASS:key_ms` ({'interactive:ttft_ms': 500.0, 'batch:e2el_ms': 20000.0}); see `slo_for`."""
    if not text:
        return None
    slo: dict[str, float] = {}
    classes: set[str] = set()
    for section in text.split(";"):
        match = _CLASS_SECTION.fullmatch(section)
        if match and match["name"].lower() not in (*SLO_KEYS, VALID_SLO_KEY) and "=" in match["items"]:
            if match["name"] in classes:
                raise ValueError(f"SLO class {match['name']!r} is given twice in {text!r}")
            classes.add(match["name"])
            items = _parse_items(match["items"])
            if not items:
                raise ValueError(f"SLO class {match['name']!r} has no limits in {text!r}")
            slo.update({f"{match['name']}{CLASS_SEP}{key}": value for key, value in items.items()})
        else:
            for key, value in _parse_items(section).items():
                if key in slo:
                    raise ValueError(f"SLO {key.removesuffix('_ms')} is given twice in {text!r}")
                slo[key] = value
    return slo or None


def _parse_items(text: str) -> dict[str, float]:
    """'ttft=500,tpot=50' or 'ttft:500 tpot:50' -> {'ttft_ms': 500.0, 'tpot_ms': 50.0} (no classes)."""
    slo: dict[str, float] = {}
    for item in text.replace(" ", ",").split(","):
        if not item:
            continue
        key, sep, value = item.replace(":", "=").partition("=")
        key = key.strip().lower().removesuffix("_ms")
        if sep and key == VALID_SLO_KEY:
            if value.strip() not in ("0", "1"):
                raise ValueError(f"bad SLO item {item!r}: valid=1 (structured outputs must validate) or valid=0")
            if value.strip() == "1":
                slo[VALID_SLO_KEY] = 1.0
            continue
        if not sep or key not in SLO_KEYS:
            raise ValueError(f"bad SLO item {item!r}: use {SLO_SYNTAX},valid=1 (any subset)")
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"bad SLO value in {item!r}: milliseconds must be a number") from None
        if ms < 0:
            raise ValueError(f"SLO {key} must be >= 0 ms, got {ms}")
        slo[f"{key}_ms"] = ms
    return slo


def slo_classes(slo: dict[str, float] | None) -> list[str]:
    """The classes an SLO names, in order."""
    return list(dict.fromkeys(key.partition(CLASS_SEP)[0] for key in slo or {} if CLASS_SEP in key))


def slo_for(slo: dict[str, float], request_class: str | None) -> dict[str, float]:
    """The limits one request must meet: the class-free ones, overridden by its own class's."""
    limits = {key: value for key, value in slo.items() if CLASS_SEP not in key}
    if request_class is not None:
        prefix = f"{request_class}{CLASS_SEP}"
        limits.update({key[len(prefix) :]: value for key, value in slo.items() if key.startswith(prefix)})
    return limits


def _stats(prefix_values: dict[str, list[float]], percentiles: Sequence[float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, seconds in prefix_values.items():
        ms = np.asarray(seconds or [0.0], dtype=float) * 1000.0
        out[f"mean_{name}_ms"] = float(np.mean(ms))
        out[f"median_{name}_ms"] = float(np.median(ms))
        out[f"std_{name}_ms"] = float(np.std(ms))
        for p in percentiles:
            out[f"{percentile_name(p)}_{name}_ms"] = float(np.percentile(ms, p))
    return out


def request_tpot(record: RequestRecord) -> float | None:
    """vLLM's per-request TPOT in seconds; None for outputs of one token or fewer."""
    if not record.success or not record.output_tokens or record.output_tokens <= 1:
        return None
    return (record.e2el - record.ttft) / (record.output_tokens - 1)  # type: ignore[operator]


def request_itl_p99(record: RequestRecord) -> float | None:
    """The request's own p99 chunk gap in seconds (numpy's linear interpolation); None with fewer than 2 chunks."""
    gaps = record.itl if record.success else []
    return float(np.percentile(gaps, 99)) if gaps else None


def request_max_stall(record: RequestRecord) -> float | None:
    """The request's longest gap between consecutive chunks in seconds (TTFT excluded); None with < 2 chunks."""
    gaps = record.itl if record.success else []
    return max(gaps) if gaps else None


def is_good(record: RequestRecord, slo: dict[str, float]) -> bool:
    """Succeeded and meets every limit of `slo` (ms) for its class (`slo_for`); a request with no TPOT or no chunk
    gap passes those."""
    if not record.success:
        return False
    slo = slo_for(slo, record.request_class)
    if slo.get(VALID_SLO_KEY) and record.output_valid is False:
        return False
    values = {"ttft_ms": record.ttft, "tpot_ms": request_tpot(record) or 0.0, "e2el_ms": record.e2el}
    if "itl_p99_ms" in slo:
        values["itl_p99_ms"] = request_itl_p99(record) or 0.0
    if "max_stall_ms" in slo:
        values["max_stall_ms"] = request_max_stall(record) or 0.0
    return all(limit / 1000.0 >= values[key] for key, limit in slo.items() if key != VALID_SLO_KEY)


def class_metrics(
    records: Sequence[RequestRecord], duration: float, slo: dict[str, float]
) -> dict[str, dict[str, float | int | None]]:
    """Per request class (the SLO's classes, then any other the records carry): `requests`, `completed`,
    `request_goodput` and `slo_attainment`, each request judged by its own class's SLO."""
    names = slo_classes(slo) + [r.request_class for r in records if r.request_class is not None]
    out: dict[str, dict[str, float | int | None]] = {}
    for name in dict.fromkeys(names):
        members = [r for r in records if r.request_class == name]
        good = sum(is_good(r, slo) for r in members)
        judged = sum(not r.cancelled for r in members)  # as overall: a client-cancelled request is no verdict
        out[name] = {
            "requests": len(members),
            "completed": sum(r.success for r in members),
            "request_goodput": good / max(duration, 1e-9),
            "slo_attainment": good / judged if judged else None,
        }
    return out


def ttft_decomposition(record: RequestRecord) -> tuple[float, float, float] | None:
    """(queue, prefill, rest) seconds from the server's engine timing, or None when it is absent."""
    timing = record.server_timing
    if not record.success or not timing:
        return None
    try:
        arrival, scheduled, first = timing["arrival_time"], timing["first_scheduled_time"], timing["first_token_time"]
    except KeyError:
        return None
    if arrival is None or scheduled is None or first is None:
        return None
    queue, prefill = scheduled - arrival, first - scheduled
    return queue, prefill, record.ttft - queue - prefill  # type: ignore[operator]


def queue_inclusive_applies(max_concurrency: int | None, request_rate: float | str | None) -> bool:
    """The one rule for reporting queue-inclusive latency: an open loop (finite rate) with a concurrency cap."""
    if max_concurrency is None or request_rate in (None, "inf"):
        return False
    return math.isfinite(float(request_rate))


def peaks(ok: Sequence[RequestRecord]) -> dict[str, float | int]:
    """vLLM's `max_output_tokens_per_s` (the busiest 1-s bucket, counted from the first send) and
    `max_concurrent_requests` (the sweep-line peak of [send, last token)). Unlike vLLM, tokens are weighted by
    each chunk's token count, so multi-token chunks are not undercounted."""
    if not ok:
        return {"max_output_tokens_per_s": 0.0, "max_concurrent_requests": 0}
    start = min(r.send_time for r in ok)
    buckets: dict[int, int] = {}
    for r in ok:
        for t, n in zip(r.chunk_times, r.chunk_tokens, strict=True):
            bucket = int(t - start)
            buckets[bucket] = buckets.get(bucket, 0) + n
    events = sorted([(r.send_time, 1) for r in ok] + [(r.last_token_time, -1) for r in ok])  # type: ignore[misc]
    running = peak = 0
    for _, step in events:  # at equal times the end (-1) sorts first: a finishing request frees its slot
        running += step
        peak = max(peak, running)
    return {"max_output_tokens_per_s": float(max(buckets.values(), default=0)), "max_concurrent_requests": peak}


def calculate_metrics(
    records: Sequence[RequestRecord],
    duration: float,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    slo: dict[str, float] | None = None,
    queue_inclusive: bool = False,
) -> dict[str, float | int | None]:
    """One point's metrics under vLLM's field names. `records` must have token counts resolved."""
    ok = [r for r in records if r.success]
    not_sent = sum(not r.sent for r in records)
    cancelled = sum(r.cancelled for r in records)
    failed = len(records) - len(ok) - not_sent - cancelled
    output_lens = [r.output_tokens or 0 for r in ok]
    total_input = sum(r.prompt_tokens or 0 for r in ok)
    total_output = sum(output_lens)
    tpots = [t for t in (request_tpot(r) for r in ok) if t is not None]
    duration = max(duration, 1e-9)
    metrics: dict[str, float | int | None] = {
        "completed": len(ok),
        "failed": failed,
        "not_sent": not_sent,
        "cancelled": cancelled,
        "duration": duration,
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": len(ok) / duration,
        "output_throughput": total_output / duration,
        "total_token_throughput": (total_input + total_output) / duration,
        "request_goodput": None,
        "slo_attainment": None,
    }
    metrics.update(peaks(ok))
    verdicts = [r.output_valid for r in ok if r.output_valid is not None]
    if verdicts:  # structured outputs: the share of completed constrained requests whose output validated
        metrics["valid_output_fraction"] = sum(verdicts) / len(verdicts)
    if slo:
        good = sum(is_good(r, slo) for r in records)
        metrics["request_goodput"] = good / duration
        judged = len(records) - cancelled  # a request the client aborted on purpose is no verdict on the server
        metrics["slo_attainment"] = good / judged if judged else None
        if slo_classes(slo) or any(r.request_class is not None for r in records):
            metrics["classes"] = class_metrics(records, duration, slo)
    metrics.update(
        _stats(
            {
                "ttft": [r.ttft for r in ok],  # type: ignore[misc]
                "tpot": tpots,
                "itl": [gap for r in ok for gap in r.itl],
                "e2el": [r.e2el for r in ok],  # type: ignore[misc]
                "max_stall": [s for s in (request_max_stall(r) for r in ok) if s is not None],
            },
            percentiles,
        )
    )
    if queue_inclusive:
        metrics.update(
            _stats(
                {
                    "client_queue_time": [r.send_time - r.intended_send_time for r in ok],
                    "e2el_including_client_queue": [
                        r.last_token_time - r.intended_send_time for r in ok  # type: ignore[operator]
                    ],
                },
                percentiles,
            )
        )
    parts = [d for d in (ttft_decomposition(r) for r in ok) if d is not None]
    if parts:
        queue, prefill, rest = zip(*parts, strict=True)
        metrics.update(_stats({"queue": list(queue), "prefill": list(prefill), "ttft_rest": list(rest)}, percentiles))
    return metrics
