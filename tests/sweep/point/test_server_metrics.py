"""The /metrics scraper: vLLM's Prometheus names, counter deltas, gauge samples, spec-decode acceptance."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
from aiohttp import web

from sweep.point.server_metrics import Scrape, ServerMetricsSampler, parse_metrics, point_server_metrics
from sweep.run.launcher import free_port

# The exposition a vLLM v1 server writes (prometheus_client: counters get `_total` and `_created` samples),
# with an engine label, a label value holding a space, and the speculative-decoding counters.
VLLM_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="my model"} 3.0
vllm:num_requests_waiting{engine="0",model_name="my model"} 5.0
vllm:kv_cache_usage_perc{engine="0",model_name="my model"} 0.25
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="my model"} 1000.0
vllm:prefix_cache_queries_created{engine="0",model_name="my model"} 1.7e9
vllm:prefix_cache_hits_total{engine="0",model_name="my model"} 250.0
vllm:num_preemptions_total{engine="0",model_name="my model"} 2.0
vllm:spec_decode_num_drafts_total{engine="0",model_name="my model"} 100.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="my model"} 300.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="my model"} 150.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="my model",position="0"} 80.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="my model",position="1"} 50.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="my model",position="2"} 20.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="my model"} 7.0
"""


def test_parse_vllm_exposition() -> None:
    s = parse_metrics(VLLM_TEXT)
    assert s.values["vllm:prefix_cache_queries"] == 1000.0  # `_total` read, `_created` ignored
    assert s.values["vllm:num_requests_waiting"] == 5.0 and s.values["vllm:kv_cache_usage_perc"] == 0.25
    assert s.values["vllm:spec_decode_num_draft_tokens"] == 300.0
    assert s.accepted_per_pos == {0: 80.0, 1: 50.0, 2: 20.0}
    assert "vllm:time_to_first_token_seconds_bucket" not in s.values
    two_engines = parse_metrics(
        'vllm:num_preemptions_total{engine="0"} 1\nvllm:num_preemptions_total{engine="1"} 4 17\n'
    )
    assert two_engines.values["vllm:num_preemptions"] == 5.0  # summed over engines; a sample timestamp is skipped
    old_names = parse_metrics("vllm:gpu_prefix_cache_queries_total 8\nvllm:gpu_cache_usage_perc 0.5\n")
    assert old_names.values == {"vllm:prefix_cache_queries": 8.0, "vllm:kv_cache_usage_perc": 0.5}


def test_deltas_and_spec_decode_acceptance_as_vllm_computes_them() -> None:
    before = parse_metrics(VLLM_TEXT)
    after = Scrape(
        values={
            **before.values,
            "vllm:prefix_cache_queries": 3000.0,
            "vllm:prefix_cache_hits": 1750.0,
            "vllm:spec_decode_num_drafts": 300.0,
            "vllm:spec_decode_num_draft_tokens": 900.0,
            "vllm:spec_decode_num_accepted_tokens": 450.0,
            "vllm:num_preemptions": 5.0,
        },
        accepted_per_pos={0: 240.0, 1: 150.0, 2: 60.0},
    )
    gauges = [Scrape({"vllm:num_requests_waiting": w, "vllm:kv_cache_usage_perc": u}) for w, u in ((2, 0.5), (6, 0.7))]
    m = point_server_metrics(before, after, gauges)
    assert m["prefix_cache_queries"] == 2000.0 and m["prefix_cache_hit_rate"] == pytest.approx(1500 / 2000)
    assert m["num_preemptions"] == 3.0
    # vLLM: rate = accepted / draft tokens * 100; length = 1 + accepted / drafts; per position = accepted / drafts
    assert m["spec_decode_acceptance_rate"] == pytest.approx(300 / 600 * 100)
    assert m["spec_decode_acceptance_length"] == pytest.approx(1 + 300 / 200)
    assert (m["spec_decode_num_drafts"], m["spec_decode_draft_tokens"], m["spec_decode_accepted_tokens"]) == (
        200,
        600,
        300,
    )
    assert m["spec_decode_per_position_acceptance_rates"] == pytest.approx([160 / 200, 100 / 200, 40 / 200])
    assert m["mean_num_requests_waiting"] == 4.0 and m["max_num_requests_waiting"] == 6.0
    assert m["max_kv_cache_usage_perc"] == 0.7 and "mean_num_requests_running" not in m  # no running samples
    no_spec = point_server_metrics(Scrape({"vllm:num_preemptions": 1.0}), Scrape({"vllm:num_preemptions": 1.0}), [])
    assert no_spec == {"num_preemptions": 0.0}  # no drafts exposed: no acceptance figures


@pytest.fixture
def metrics_server() -> Iterator[tuple[str, dict]]:
    """A server whose counters the test advances while the sampler runs."""
    state = {"drafts": 0, "accepted": 0, "waiting": 0}

    async def metrics(request: web.Request) -> web.Response:
        text = (
            f"vllm:spec_decode_num_drafts_total {state['drafts']}\n"
            f"vllm:spec_decode_num_draft_tokens_total {state['drafts'] * 2}\n"
            f"vllm:spec_decode_num_accepted_tokens_total {state['accepted']}\n"
            f"vllm:num_requests_waiting {state['waiting']}\n"
        )
        return web.Response(text=text)

    port = free_port()
    loop = asyncio.new_event_loop()
    started = threading.Event()

    async def serve() -> None:
        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        started.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(serve()), loop.run_forever()), daemon=True)
    thread.start()
    started.wait(10)
    yield f"http://127.0.0.1:{port}/v1", state
    loop.call_soon_threadsafe(loop.stop)


def test_sampler_scrapes_before_during_and_after(metrics_server: tuple[str, dict]) -> None:
    url, state = metrics_server
    state.update(drafts=10, accepted=5)  # before the point: not counted
    sampler = ServerMetricsSampler(url, interval_s=0.02)
    sampler.begin()
    state.update(waiting=4)
    time.sleep(0.15)
    state.update(drafts=30, accepted=25, waiting=0)
    m = sampler.end()
    assert m is not None and m["spec_decode_acceptance_rate"] == pytest.approx(20 / 40 * 100)
    assert m["max_num_requests_waiting"] == 4.0


def test_no_metrics_endpoint_gives_none() -> None:
    sampler = ServerMetricsSampler(f"http://127.0.0.1:{free_port()}/v1")
    sampler.begin()
    assert sampler.end() is None
