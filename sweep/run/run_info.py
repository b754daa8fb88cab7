"""What a sweep records about its run besides the points: the run directory's config.json (`run_config`, for
`bench sweep` and `bench simulate` alike), versions, the machine, the client's own health, and the reachability
and health checks of a target URL (`TargetUnhealthy` when it fails them)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from sweep.point.records import RequestRecord
from sweep.point.runner import PointRun
from sweep.run.load_config import LoadConfig


class TargetUnhealthy(RuntimeError):
    """The served engine died or stopped answering: unreachable, or /health answers with a 5xx."""


def run_config(
    load: LoadConfig,
    output_dir: Path,
    salt: str,
    command: str,
    target: dict[str, Any],
    sweep: dict[str, Any],
    simulated: bool = False,
    **extra: Any,
) -> dict[str, Any]:
    """The run directory's config.json: its id, the target, the workload (with the prompt salt), the load
    (`load.sweep_record()` and the caller's own `sweep` fields), the SLO, versions, the machine, `extra` (a
    measured run's `calibration`) and the command line. A simulated run says so (`"simulated": true`)."""
    return {
        "run_id": f"{output_dir.name}-{salt}",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **({"simulated": True} if simulated else {}),
        "target": target,
        "workload": {**asdict(load.workload), "salt": salt},
        "sweep": {**load.sweep_record(), **sweep},
        "slo": load.slo,
        "percentiles": load.percentiles,
        "versions": versions(),
        "machine": machine(),
        **extra,
        "command": command,
    }


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for package in ("servelab", "aiohttp", "numpy", "transformers", "torch"):
        try:
            out[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def machine() -> dict[str, Any]:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else None
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "memory_bytes": memory,
    }


def _pct(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    a = np.asarray(values, dtype=float) * 1000.0
    return {"p50_ms": float(np.median(a)), "p99_ms": float(np.percentile(a, 99)), "max_ms": float(a.max())}


def client_fidelity(run: PointRun) -> dict[str, Any]:
    """The client's own health: schedule lag, and token counts of the server against ours."""
    records = run.records
    ok = [r for r in records if r.success]
    lags = [r.send_time - r.intended_send_time for r in records if r.sent]
    out: dict[str, Any] = {"send_lag": _pct(lags), **run.extras}
    with_both = [r for r in ok if r.usage_output_tokens and r.client_output_tokens is not None]
    out["usage_reported"] = sum(r.usage_output_tokens is not None for r in ok)
    if with_both:
        diffs = [abs(r.client_output_tokens - r.usage_output_tokens) / r.usage_output_tokens for r in with_both]
        out["output_token_discrepancy_mean"] = float(np.mean(diffs))
        out["output_token_discrepancy_over_10pct"] = sum(d > 0.1 for d in diffs)
    counted = [r for r in ok if not r.usage_output_tokens and r.client_output_tokens]
    if counted:  # no usage: chunks were counted as one token each; re-tokenising says how far off that is
        out["chunks_vs_retokenized_mismatch"] = sum(sum(r.chunk_tokens) != r.client_output_tokens for r in counted)
        out["retokenized_tokens_per_chunk_mean"] = float(
            sum(r.client_output_tokens for r in counted) / max(1, sum(len(r.chunk_times) for r in counted))
        )
    streamed = [r for r in ok if r.usage_output_tokens]
    if streamed:
        out["chunk_token_sum_mismatch"] = sum(sum(r.chunk_tokens) != r.usage_output_tokens for r in streamed)
        out["tokens_per_chunk_mean"] = float(
            sum(r.usage_output_tokens for r in streamed) / max(1, sum(len(r.chunk_times) for r in streamed))
        )
    return out


def openai_base_url(url: str) -> str:
    """The OpenAI base URL the client posts under: a URL with no path is a server's root, and gets `/v1` (as vLLM's
    `bench serve --base-url` does); one with a path is kept as given, less a trailing slash."""
    url = url.rstrip("/")
    return url + "/v1" if urllib.parse.urlsplit(url).path == "" else url


def check_reachable(url: str, api_key: str | None) -> None:
    """GET {url}/models: an unreachable server, a rejected key or a URL with no OpenAI API under it (404) fails
    before any file is written."""
    request = urllib.request.Request(url.rstrip("/") + "/models")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        urllib.request.urlopen(request, timeout=10).close()
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            raise RuntimeError(f"{url} rejected the API key (HTTP {e.code}); pass --api-key") from None
        if e.code == 404:
            raise TargetUnhealthy(f"{url} has no OpenAI API: GET {url}/models answered 404; the base URL is the "
                                  "path the API lives under, usually http://HOST:PORT/v1") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise TargetUnhealthy(f"cannot reach {url}: {reason}; is the server up, and is the URL's /v1 right?") from None


def workload_fidelity(run: PointRun) -> dict[str, Any]:
    """`workloads.fidelity` of the point's successful requests: lengths asked vs served, schedule vs sends."""
    import workloads

    if not hasattr(workloads, "fidelity") or not run.records:
        return {}
    ok: list[RequestRecord] = [r for r in run.records if r.success]
    by_index = {r.index: r for r in ok}
    if not ok:
        return {}
    pairs = [(s, by_index[p.index]) for s, p in zip(run.specs, run.prompts, strict=True) if p.index in by_index]
    report = workloads.fidelity(
        [s for s, _ in pairs],
        [r.prompt_tokens for _, r in pairs],
        [r.output_tokens for _, r in pairs],
        intended_send_times=[r.intended_send_time - run.t0 for _, r in pairs],
        actual_send_times=[r.send_time - run.t0 for _, r in pairs],
    )
    return report if isinstance(report, dict) else asdict(report)


def check_target_healthy(url: str, label: str, failed: int) -> None:
    """After a point with failures against a --url server: stop the sweep, saying so, if the server is down or
    answers /health with a 5xx (our server answers 503 once its engine process died)."""
    root = url.removesuffix("/v1")
    try:
        with urllib.request.urlopen(root + "/health", timeout=10):
            return
    except urllib.error.HTTPError as e:
        if e.code < 500:
            return  # no /health route (404) or it needs a key: not a verdict on the server
        why = f"answers /health with {e.code}: {e.read()[:200].decode(errors='replace')}"
    except (urllib.error.URLError, OSError) as e:
        why = f"is unreachable ({getattr(e, 'reason', e)})"
    raise TargetUnhealthy(
        f"point {label} finished with {failed} failed requests and is kept, but the server {root} {why}; "
        "later points were not run: restart the server and rerun with the same flags and --resume"
    )
