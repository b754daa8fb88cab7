"""Server-side metrics during a point: the target's Prometheus `/metrics` (vLLM's names; servelab's match).

Counters are scraped when the point starts and when it ends and recorded as deltas: prefix-cache queries and hits
(-> hit rate), preemptions, prompt and generation tokens, and speculative decoding's drafts, draft tokens and
accepted tokens (overall and per draft position), from which the acceptance rate and length follow exactly as
vLLM's `bench serve` computes them (vllm/benchmarks/serve.py, `fetch_spec_decode_metrics` and `benchmark`).
Gauges (running and waiting requests, KV-cache usage) mean nothing after the point has drained, so they are
sampled every `interval_s` while it runs and reported as mean and max. A server without `/metrics` (or one that
exposes none of these names) gives no server metrics; the point is measured all the same.

Sampling runs in a thread with blocking HTTP, so it never shares the client's event loop.
"""

from __future__ import annotations

import math
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

# vLLM's counter names (exposed with a `_total` suffix), and the older spellings of the same quantities.
COUNTERS = {
    "vllm:prefix_cache_queries": ("vllm:gpu_prefix_cache_queries",),
    "vllm:prefix_cache_hits": ("vllm:gpu_prefix_cache_hits",),
    "vllm:num_preemptions": (),
    "vllm:prompt_tokens": (),
    "vllm:generation_tokens": (),
    "vllm:spec_decode_num_drafts": (),
    "vllm:spec_decode_num_draft_tokens": (),
    "vllm:spec_decode_num_accepted_tokens": (),
}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
GAUGES = {
    "vllm:num_requests_running": (),
    "vllm:num_requests_waiting": (),
    "vllm:kv_cache_usage_perc": ("vllm:gpu_cache_usage_perc",),
}
DEFAULT_INTERVAL_S = 0.5
SCRAPE_TIMEOUT_S = 5.0


@dataclass
class Scrape:
    """One scrape: every sample summed over its label sets (engines, models), per metric name."""

    values: dict[str, float] = field(default_factory=dict)
    accepted_per_pos: dict[int, float] = field(default_factory=dict)


def _label(labels: str, name: str) -> str | None:
    key = f'{name}="'
    start = labels.find(key)
    if start < 0:
        return None
    start += len(key)
    return labels[start : labels.index('"', start)]


def parse_metrics(text: str) -> Scrape:
    """Parse the Prometheus text format into the names this module knows (counters without `_total`)."""
    aliases = {old: new for new, olds in (COUNTERS | GAUGES).items() for old in olds}
    known = set(COUNTERS) | set(GAUGES)
    scrape = Scrape()
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "{" in line:  # NAME{LABELS} VALUE [TIMESTAMP]; label values may hold spaces
            name, _, rest = line.partition("{")
            labels, _, rest = rest.rpartition("}")
        else:
            name, _, rest = line.partition(" ")
            labels = ""
        fields = rest.split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        if not math.isfinite(value):
            continue
        base = name.removesuffix("_total")
        base = aliases.get(base, base)
        if base == PER_POSITION:
            position = _label(labels, "position")
            if position is not None and position.isdigit():
                pos = int(position)
                scrape.accepted_per_pos[pos] = scrape.accepted_per_pos.get(pos, 0.0) + value
        elif base in known:
            scrape.values[base] = scrape.values.get(base, 0.0) + value
    return scrape


def point_server_metrics(before: Scrape, after: Scrape, gauges: list[Scrape]) -> dict[str, Any]:
    """The point's server metrics: counter deltas, derived rates, and gauge mean/max while it ran.

    Field names follow vLLM's result JSON where it has one (`spec_decode_*`)."""
    out: dict[str, Any] = {}
    delta = {name: after.values[name] - before.values.get(name, 0.0) for name in COUNTERS if name in after.values}
    for name, value in delta.items():
        out[name.removeprefix("vllm:")] = value
    queries, hits = delta.get("vllm:prefix_cache_queries"), delta.get("vllm:prefix_cache_hits")
    if queries:
        out["prefix_cache_hit_rate"] = (hits or 0.0) / queries
    drafts = delta.get("vllm:spec_decode_num_drafts", 0.0)
    draft_tokens = delta.get("vllm:spec_decode_num_draft_tokens", 0.0)
    accepted = delta.get("vllm:spec_decode_num_accepted_tokens", 0.0)
    if draft_tokens > 0:  # as vLLM: a rate in percent, a length counting the target's own token
        out["spec_decode_acceptance_rate"] = accepted / draft_tokens * 100.0
        out["spec_decode_acceptance_length"] = 1.0 + accepted / drafts if drafts > 0 else 0.0
        out["spec_decode_num_drafts"] = int(drafts)
        out["spec_decode_draft_tokens"] = int(draft_tokens)
        out["spec_decode_accepted_tokens"] = int(accepted)
        positions = sorted(set(before.accepted_per_pos) | set(after.accepted_per_pos))
        rates = []
        for p in positions:
            start = before.accepted_per_pos.get(p, 0.0)
            rates.append((after.accepted_per_pos.get(p, start) - start) / drafts if drafts > 0 else 0.0)
        out["spec_decode_per_position_acceptance_rates"] = rates
    for name in GAUGES:
        samples = [g.values[name] for g in gauges if name in g.values]
        if samples:
            short = name.removeprefix("vllm:")
            out[f"mean_{short}"] = sum(samples) / len(samples)
            out[f"max_{short}"] = max(samples)
    return out


def scrape(url: str, api_key: str | None = None) -> Scrape | None:
    """GET `url` (the server root's /metrics); None when it is absent or unreadable."""
    request = urllib.request.Request(url)
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=SCRAPE_TIMEOUT_S) as response:
            text = response.read().decode("utf-8", errors="replace")
    except (urllib.error.URLError, OSError, ValueError):
        return None
    parsed = parse_metrics(text)
    return parsed if parsed.values or parsed.accepted_per_pos else None


class ServerMetricsSampler:
    """`begin()` at the point's start, `end()` after it; `end()` returns the point's server metrics (or None).
    Gauges get figures only when at least one sample fell inside the point (points longer than `interval_s`)."""

    def __init__(self, base_url: str, api_key: str | None = None, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.url = base_url.rstrip("/").removesuffix("/v1") + "/metrics"
        self.api_key = api_key
        self.interval_s = interval_s
        self._before: Scrape | None = None
        self._gauges: list[Scrape] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def begin(self) -> None:
        self._before = scrape(self.url, self.api_key)
        if self._before is None:
            return  # no /metrics: nothing to sample
        self._gauges = []
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, name="server-metrics", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            sample = scrape(self.url, self.api_key)
            if sample is not None:
                self._gauges.append(sample)

    def end(self) -> dict[str, Any] | None:
        if self._before is None:
            return None
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        after = scrape(self.url, self.api_key)
        if after is None:
            return None
        return point_server_metrics(self._before, after, self._gauges)
