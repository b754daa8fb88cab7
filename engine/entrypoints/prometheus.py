"""Prometheus metrics under vLLM's names, each with the `model_name` label.

Gauges and counters mirror the engine's SchedulerStats (counters advance by the change in the engine's
cumulative totals). Latency histograms follow vLLM's interval rules: TTFT, inter-token latency and end-to-end
latency are measured on the API process's clock, from the moment the request was received to the moment its
tokens reached the API process; queue, prefill and decode times are differences of engine-clock stamps. Stamps
from the two processes are never subtracted from each other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)

from engine.outputs import SchedulerStats, SpecDecodingStats
from engine.request import RequestTiming

if TYPE_CHECKING:
    from engine.entrypoints.engine_client import RequestStream

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# vLLM's buckets (vllm/v1/metrics/loggers.py).
_TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]  # fmt: skip
_ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0]  # fmt: skip
_REQUEST_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                    240.0, 480.0, 960.0, 1920.0, 7680.0]  # fmt: skip
_GRAMMAR_COMPILE_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]
_GRAMMAR_BITMASK_BUCKETS = [1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2]

# SchedulerStats cumulative field → counter name.
_COUNTERS = {
    "prefix_cache_queries": ("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache."),
    "prefix_cache_hits": ("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache."),
    "num_preemptions": ("vllm:num_preemptions", "Cumulative number of preemptions."),
    "num_prompt_tokens": ("vllm:prompt_tokens", "Number of prefill tokens processed."),
    "num_generation_tokens": ("vllm:generation_tokens", "Number of generation tokens processed."),
}

# SpecDecodingStats cumulative field → counter name (vLLM's; registered once the engine reports speculation).
_SPEC_DECODE_COUNTERS = {
    "num_drafts": ("vllm:spec_decode_num_drafts", "Number of spec decoding drafts."),
    "num_draft_tokens": ("vllm:spec_decode_num_draft_tokens", "Number of draft tokens."),
    "num_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."),
}


class ServerMetrics:
    def __init__(self, model_name: str) -> None:
        disable_created_metrics()  # as vLLM: no `_created` series
        self.registry = CollectorRegistry()
        self.model_name = model_name
        labels = ["model_name"]

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=self.registry)

        def histogram(name: str, doc: str, buckets: list[float]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=self.registry)

        self.num_requests_running = gauge("vllm:num_requests_running", "Number of requests in model execution.")
        self.num_requests_waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_cache_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.counters = {
            field: Counter(name, doc, labels, registry=self.registry) for field, (name, doc) in _COUNTERS.items()
        }
        self.request_success = Counter(
            "vllm:request_success", "Count of successfully processed requests.", [*labels, "finished_reason"],
            registry=self.registry,
        )  # fmt: skip
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Time to first token in seconds.", _TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Inter-token latency in seconds.", _ITL_BUCKETS)
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds", "End-to-end request latency in seconds.", _REQUEST_BUCKETS
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds", "Time spent in the WAITING phase in seconds.", _REQUEST_BUCKETS
        )
        self.prefill_time = histogram(
            "vllm:request_prefill_time_seconds", "Time spent in the PREFILL phase in seconds.", _REQUEST_BUCKETS
        )
        self.decode_time = histogram(
            "vllm:request_decode_time_seconds", "Time spent in the DECODE phase in seconds.", _REQUEST_BUCKETS
        )
        self.grammar_compile_time = histogram(
            "servelab:request_grammar_compile_time_seconds",
            "Structured outputs: time a request waited for its compiled grammar (0 when cached).",
            _GRAMMAR_COMPILE_BUCKETS,
        )
        self.grammar_bitmask_time = histogram(
            "servelab:grammar_bitmask_time_per_step_seconds",
            "Structured outputs: per request, the mean time per step spent filling its grammar bitmask rows.",
            _GRAMMAR_BITMASK_BUCKETS,
        )
        self._last_stats = SchedulerStats()
        self._spec_counters: dict[str, Counter] = {}
        self._spec_per_pos: Counter | None = None
        for metric in (self.num_requests_running, self.num_requests_waiting, self.kv_cache_usage,
                       *self.counters.values(), self.ttft, self.itl, self.e2e, self.queue_time,
                       self.prefill_time, self.decode_time, self.grammar_compile_time,
                       self.grammar_bitmask_time):  # fmt: skip
            metric.labels(model_name)  # export every series from the start, at zero
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes etc. of this (API) process

    def watch_engine_process(self, pid: int) -> None:
        """Also export the engine process's memory and CPU (servelab_engine_process_*), which `bench soak` reads."""
        ProcessCollector(namespace="servelab_engine", pid=lambda: pid, registry=self.registry)

    def set_engine_info(self, num_gpu_blocks: int, block_size: int, tensor_parallel_size: int) -> None:
        """vLLM's `vllm:cache_config_info` (KV blocks per rank) and the tensor-parallel size, as info gauges."""
        cache_info = Gauge("vllm:cache_config_info", "Information of the KV cache (num_gpu_blocks is per rank).",
                           ["model_name", "block_size", "num_gpu_blocks"], registry=self.registry)  # fmt: skip
        cache_info.labels(self.model_name, str(block_size), str(num_gpu_blocks)).set(1)
        parallel_info = Gauge("servelab:parallel_config_info", "Information of the parallel configuration.",
                              ["model_name", "tensor_parallel_size"], registry=self.registry)  # fmt: skip
        parallel_info.labels(self.model_name, str(tensor_parallel_size)).set(1)

    def update_stats(self, stats: SchedulerStats) -> None:
        name = self.model_name
        self.num_requests_running.labels(name).set(stats.num_running_reqs)
        self.num_requests_waiting.labels(name).set(stats.num_waiting_reqs)
        self.kv_cache_usage.labels(name).set(stats.kv_cache_usage)
        for field, counter in self.counters.items():
            delta = getattr(stats, field) - getattr(self._last_stats, field)
            if delta > 0:  # a prefix-cache reset may restart the engine's totals
                counter.labels(name).inc(delta)
        if stats.spec_decoding_stats is not None:
            self._update_spec_decoding(stats.spec_decoding_stats, self._last_stats.spec_decoding_stats)
        self._last_stats = stats

    def _update_spec_decoding(self, stats: SpecDecodingStats, last: SpecDecodingStats | None) -> None:
        """vLLM's four spec-decode counters, created when the engine first reports them (speculation is on)."""
        name = self.model_name
        if self._spec_per_pos is None:
            self._spec_counters = {
                field: Counter(metric, doc, ["model_name"], registry=self.registry)
                for field, (metric, doc) in _SPEC_DECODE_COUNTERS.items()
            }
            self._spec_per_pos = Counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
                ["model_name", "position"], registry=self.registry,
            )  # fmt: skip
        last = last or SpecDecodingStats(stats.num_spec_tokens)
        for field, counter in self._spec_counters.items():
            counter.labels(name).inc(max(getattr(stats, field) - getattr(last, field), 0))
        per_pos = zip(stats.num_accepted_tokens_per_pos, last.num_accepted_tokens_per_pos, strict=True)
        for position, (accepted, before) in enumerate(per_pos):
            self._spec_per_pos.labels(name, str(position)).inc(max(accepted - before, 0))

    def observe_tokens(self, stream: RequestStream, now: float) -> None:
        if stream.first_token_api_time is None:
            self.ttft.labels(self.model_name).observe(now - stream.api_arrival)
        elif stream.last_token_api_time is not None:
            self.itl.labels(self.model_name).observe(now - stream.last_token_api_time)

    def observe_finished(self, stream: RequestStream, timing: RequestTiming | None, finish_reason: str) -> None:
        name = self.model_name
        self.request_success.labels(name, finish_reason).inc()
        if stream.last_token_api_time is not None:
            self.e2e.labels(name).observe(stream.last_token_api_time - stream.api_arrival)
        if timing is None:
            return
        if timing.first_scheduled_time is not None:
            self.queue_time.labels(name).observe(max(0.0, timing.first_scheduled_time - timing.arrival_time))
            if timing.first_token_time is not None:
                self.prefill_time.labels(name).observe(max(0.0, timing.first_token_time - timing.first_scheduled_time))
        if timing.first_token_time is not None and timing.finished_time is not None:
            self.decode_time.labels(name).observe(max(0.0, timing.finished_time - timing.first_token_time))
        if timing.grammar_compile_time is not None:
            self.grammar_compile_time.labels(name).observe(timing.grammar_compile_time)
        if timing.num_grammar_bitmask_steps:
            per_step = timing.grammar_bitmask_time / timing.num_grammar_bitmask_steps
            self.grammar_bitmask_time.labels(name).observe(per_step)

    def render(self) -> bytes:
        return generate_latest(self.registry)
