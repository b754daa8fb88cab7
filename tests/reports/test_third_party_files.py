"""Importers on files the real tools wrote (GuideLLM 0.8.1), or laid out field by field as the real tool writes
them (vLLM `bench serve --save-result --save-detailed`), and the report that overlays them with a servelab run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from synthetic_runs import synthetic_run_dir

from reports import plots
from reports.importers import load_run, load_runs
from reports.recompute import point_metrics

THIRD_PARTY = Path(__file__).resolve().parents[1] / "fixtures" / "third_party"
GUIDELLM = THIRD_PARTY / "guidellm_0.8.1_report.json"


def test_real_guidellm_report_imports_to_guidellms_own_figures() -> None:
    run = load_run(GUIDELLM)
    point = run.points.iloc[0]
    assert (run.source, run.mode, point["label"]) == ("guidellm", "concurrency", "c0004")
    assert (point["completed"], point["failed"], point["incomplete"]) == (24, 0, 0)
    assert point["total_output_tokens"] == 24 * 16
    own = json.loads(GUIDELLM.read_text())["benchmarks"][0]["metrics"]
    # GuideLLM's median TTFT (20.77 ms) and inter-token latency (5.00 ms; TPOT by our definition) from its own
    # timings: the importer reads the same request timestamps, so the medians agree to well under 1 %
    assert point["median_ttft_ms"] == pytest.approx(own["time_to_first_token_ms"]["successful"]["median"], rel=0.01)
    assert point["median_tpot_ms"] == pytest.approx(own["inter_token_latency_ms"]["successful"]["median"], rel=0.01)


def test_report_overlays_real_guidellm_with_a_servelab_run_without_slo(tmp_path: Path) -> None:
    """The bug: a servelab run over loads 1..16 (a log2 axis) without an SLO left the attainment axis empty, and
    drawing the goodput figure of `bench report guidellm_report.json RUN_DIR` failed with "Data cannot be
    log-scaled because all values are <= 0"."""
    runs = load_runs([synthetic_run_dir(tmp_path / "servelab", seed=3, loads=[1, 4, 16], slo=None), GUIDELLM])
    fig = plots.goodput_vs_load(runs, None)
    path = plots.save(fig, tmp_path / "goodput.png")  # drawing is where matplotlib failed
    assert path.stat().st_size > 0
    assert fig.axes[0].get_xscale() == "log" and fig.axes[1].get_xscale() == "linear"  # the empty axis stays linear


def vllm_detailed_result(rate: float | str, max_concurrency: int | None) -> dict:
    """A result JSON laid out as vllm/benchmarks/serve.py writes it with --save-result --save-detailed.

    Field list and order from vllm-project/vllm @ 009e6d4a1cd6ba3fb2a9fc00f4ec06f5297232a1, vllm/benchmarks/serve.py:
    `main_async` writes date, endpoint_type, backend, label, model_id, tokenizer_id, num_prompts, request_rate ("inf"
    or a float), burstiness, max_concurrency, then merges `benchmark()`'s result: duration, completed, failed,
    total_input_tokens, total_output_tokens, request_throughput, request_goodput (None without --goodput),
    output_throughput, total_token_throughput, input_lens, output_lens, ttfts, itls, latencies, start_times,
    queue_times, generated_texts, errors, max_output_tokens_per_s, max_concurrent_requests, rtfx, then per selected
    metric (default ttft, tpot, itl) mean_/median_/std_/pNN_{metric}_ms, and with --max-concurrency
    client_queue_time (and, for a finite rate, e2el_including_client_queue). A failed request keeps
    RequestFuncOutput's defaults (vllm/benchmarks/lib/endpoint_request_func.py): ttft 0.0, itl [], latency 0.0,
    output length 0, and its error text (a traceback); a successful one has error "".
    """
    ttfts = [0.021, 0.034, 0.0, 0.025, 0.051, 0.030]
    itls = [[0.005] * 7, [0.006, 0.004, 0.007], [], [0.005] * 3, [0.009] * 7, [0.005, 0.005]]
    starts = [100.0, 100.25, 100.5, 100.75, 101.0, 101.25]
    queues = [0.0, 0.0, 0.01, 0.04, 0.0, 0.12]
    errors = [
        "",
        "",
        "Traceback (most recent call last):\n  ...\naiohttp.ClientPayloadError: Response payload",
        "",
        "",
        "",
    ]
    output_lens = [8, 4, 0, 4, 8, 3]
    latencies = [t + sum(i) if not e else 0.0 for t, i, e in zip(ttfts, itls, errors, strict=True)]
    ok = [i for i, e in enumerate(errors) if not e]
    tpots = [(latencies[i] - ttfts[i]) / (output_lens[i] - 1) for i in ok if output_lens[i] > 1]
    duration = 1.6
    result = {
        "date": "20261201-053000",
        "endpoint_type": "openai",
        "backend": "openai",
        "label": None,
        "model_id": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "tokenizer_id": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "num_prompts": 6,
        "request_rate": rate,
        "burstiness": 1.0,
        "max_concurrency": max_concurrency,
        "duration": duration,
        "completed": len(ok),
        "failed": 6 - len(ok),
        "total_input_tokens": 32 * len(ok),
        "total_output_tokens": sum(output_lens),
        "request_throughput": len(ok) / duration,
        "request_goodput": None,
        "output_throughput": sum(output_lens) / duration,
        "total_token_throughput": (32 * 5 + 27) / duration,
        "input_lens": [32] * 6,
        "output_lens": output_lens,
        "ttfts": ttfts,
        "itls": itls,
        "latencies": latencies,
        "start_times": starts,
        "queue_times": queues,
        "generated_texts": ["x"] * 6,
        "errors": errors,
        "max_output_tokens_per_s": 13.0,
        "max_concurrent_requests": 1,
        "rtfx": 0.0,
    }
    for name, values in (("ttft", [ttfts[i] for i in ok]), ("tpot", tpots), ("itl", [g for i in ok for g in itls[i]])):
        ms = np.asarray(values) * 1000
        result |= {
            f"mean_{name}_ms": ms.mean(),
            f"median_{name}_ms": float(np.median(ms)),
            f"std_{name}_ms": ms.std(),
            f"p99_{name}_ms": float(np.percentile(ms, 99)),
        }
    if max_concurrency is not None:
        result["mean_client_queue_time_ms"] = float(np.mean([queues[i] for i in ok]) * 1000)
        if rate != "inf":
            result["mean_e2el_including_client_queue_ms"] = float(
                np.mean([latencies[i] + queues[i] for i in ok]) * 1000
            )
    return result


@pytest.mark.parametrize(
    ("rate", "cap", "label", "mode"), [(4.0, 2, "r0004.00", "rate"), ("inf", 2, "c0002", "concurrency")]
)
def test_vllm_serve_detailed_result(tmp_path: Path, rate: float | str, cap: int, label: str, mode: str) -> None:
    data = vllm_detailed_result(rate, cap)
    path = tmp_path / "openai-4.0qps-concurrency2-SmolLM2-135M-Instruct-20261201-053000.json"
    path.write_text(json.dumps(data))
    run = load_run(path)
    point = run.points.iloc[0]
    # a rate point with a cap is a rate point (it was labelled by its cap, c0002, before)
    assert (run.source, run.mode, point["label"]) == ("vllm", mode, label)
    rows = run.requests
    assert rows["success"].tolist() == [True, True, False, True, True, True]
    assert rows.loc[2, "error"].startswith("Traceback")
    assert rows["intended_send_time"].tolist() == pytest.approx(
        [s - q for s, q in zip(data["start_times"], data["queue_times"], strict=True)]
    )
    again = point_metrics(rows, data["duration"], (50, 99), None, data["max_concurrency"], data["request_rate"])
    for key in ("median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_itl_ms", "total_output_tokens", "completed"):
        assert again[key] == pytest.approx(data[key]), key
    assert again["failed"] == data["failed"] and again["not_sent"] == 0
    if mode == "rate":  # queue-inclusive figures for an open loop with a cap, as vLLM's E2EL incl. queue
        for key in ("mean_client_queue_time_ms", "mean_e2el_including_client_queue_ms"):
            assert again[key] == pytest.approx(data[key]), key
    else:  # vLLM also writes client_queue_time for a closed loop (elapsed time there); the importer keeps its figure
        assert "mean_client_queue_time_ms" not in again and point["mean_client_queue_time_ms"] == pytest.approx(
            data["mean_client_queue_time_ms"]
        )
    assert point["median_e2el_ms"] == pytest.approx(np.median([data["latencies"][i] for i in (0, 1, 3, 4, 5)]) * 1000)
