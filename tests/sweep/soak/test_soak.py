"""`bench soak`: the request mix, /metrics parsing, windows and verdict by hand, and a soak of `bench serve`."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.entrypoints.protocol import ApiError, parse_chat_request, parse_completion_request
from sweep.soak.cases import MALFORMED_KINDS, SoakMix, is_openai_error_body, make_case, malformed_case
from sweep.soak.commands import parse_duration
from sweep.soak.report import SoakBounds, percentile, summarize
from sweep.soak.runner import parse_metrics

REPO = Path(__file__).resolve().parents[3]


def test_mix_parse_and_errors() -> None:
    mix = SoakMix.parse("cancel=0.2, malformed=0.3")
    assert (mix.cancel, mix.malformed, mix.disconnect) == (0.2, 0.3, 0.05)
    with pytest.raises(ValueError, match="unknown share 'cancle'"):
        SoakMix.parse("cancle=0.1")
    with pytest.raises(ValueError, match="--mix cancel takes a number"):
        SoakMix.parse("cancel=lots")
    with pytest.raises(ValueError, match="at most 1"):
        SoakMix.parse("cancel=0.5,malformed=0.6")


def test_parse_duration() -> None:
    assert [parse_duration(t) for t in ("90", "90s", "10m", "1.5h")] == [90, 90, 600, 5400]
    for bad in ("ten", "-1m", "0"):
        with pytest.raises(ValueError, match="--duration"):
            parse_duration(bad)


def _parse(path: str, body: bytes) -> None:
    """What our server's parser does with a malformed body (raises ApiError for a 4xx)."""
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError) as error:
        raise ApiError(400, "not JSON") from error
    (parse_chat_request if path.endswith("chat/completions") else parse_completion_request)(payload)


def test_malformed_cases_are_invalid_and_valid_cases_fit_the_context() -> None:
    rng = random.Random(0)
    seen = set()
    for _ in range(400):
        case = malformed_case(rng, "m", max_model_len=256, oversized_bytes=100)
        seen.add(case.malformed_kind)
        if case.malformed_kind in ("unknown_field", "bad_route", "over_long_prompt", "oversized_body"):
            continue  # accepted by the parser; refused by routing, the context check or the body limit
        with pytest.raises(ApiError) as caught:
            _parse(case.path, case.body)
        assert 400 <= caught.value.status < 500
    assert seen == set(MALFORMED_KINDS)
    mix = SoakMix(long_output=0.5)
    for _ in range(300):
        case = make_case(rng, mix, "m", 256, 16, 100)
        if case.kind == "malformed":
            continue
        body = json.loads(case.body)
        words = len((body.get("prompt") or body["messages"][0]["content"]).split())
        assert 1 <= case.max_tokens == body["max_tokens"] and 2 * words + case.max_tokens <= 256
        assert case.kind != "cancel" or (case.stream and 1 <= case.cancel_after_chunks < case.max_tokens)


def test_error_body_shapes() -> None:
    assert is_openai_error_body({"error": {"message": "x", "type": "t"}})
    assert is_openai_error_body({"object": "error", "message": "x"})
    assert not is_openai_error_body({"detail": "x"}) and not is_openai_error_body(None)


def test_parse_metrics_sums_memory_series() -> None:
    text = """# HELP x
vllm:kv_cache_usage_perc{model_name="m"} 0.25
vllm:num_requests_running{model_name="m"} 3.0
vllm:num_requests_waiting{model_name="m"} 1.0
process_resident_memory_bytes 1.0e+08
servelab_engine_process_resident_memory_bytes 2.5e+08
vllm:prompt_tokens_total{model_name="m"} 7.0
"""
    assert parse_metrics(text) == {"kv_cache_usage": 0.25, "num_requests_running": 3.0, "num_requests_waiting": 1.0,
                                   "resident_memory_bytes": 3.5e8}  # fmt: skip


def test_percentile_matches_numpy() -> None:
    values = [random.Random(1).random() for _ in range(37)]
    for q in (0, 50, 90, 99, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert percentile([], 50) is None


def _row(start: float, outcome: str = "ok", ttft: float = 0.1, tpot: float = 0.01) -> dict:
    return {"kind": "valid", "start": start, "outcome": outcome, "ttft": ttft, "tpot": tpot, "latency": 1.0}


def test_windows_and_verdict_by_hand() -> None:
    # 4 windows over 40 s; the last window is 2x slower (TTFT) and memory grows 10 %.
    rows = [_row(t, ttft=0.2 if t >= 30 else 0.1) for t in range(40)] + [_row(5.5, "expected_4xx")]
    samples = [{"time": t, "resident_memory_bytes": 100.0 if t < 30 else 110.0, "kv_cache_usage": 0.5,
                "num_requests_running": 2.0} for t in (9, 19, 29, 39)]  # fmt: skip
    final = {"kv_cache_usage": 0.0, "num_requests_running": 0.0}
    summary = summarize(rows, samples, final, 40.0, 4, SoakBounds(max_latency_drift=0.5, max_memory_growth=0.05))
    first, last = summary["windows"][0], summary["windows"][-1]
    assert first["requests"] == 11 and first["outcomes"] == {"ok": 10, "expected_4xx": 1} and first["unexpected"] == 0
    assert first["ttft_p50"] == pytest.approx(0.1) and last["ttft_p50"] == pytest.approx(0.2)
    checks = summary["verdict"]["checks"]
    assert checks["ttft_drift"]["value"] == pytest.approx(1.0) and checks["ttft_drift"]["passed"] is False
    assert checks["tpot_drift"]["value"] == pytest.approx(0.0) and checks["tpot_drift"]["passed"] is True
    assert checks["memory_growth"]["value"] == pytest.approx(0.1) and checks["memory_growth"]["passed"] is False
    assert checks["kv_freed"]["passed"] is True and checks["unexpected_errors"]["value"] == 0
    assert summary["verdict"]["passed"] is False
    loose = summarize(rows, samples, final, 40.0, 4, SoakBounds(max_latency_drift=1.5, max_memory_growth=0.2))
    assert loose["verdict"]["passed"] is True
    leftover = summarize(rows + [_row(1, "timeout")], samples, {"kv_cache_usage": 0.1}, 40.0, 4,
                         SoakBounds(max_latency_drift=9, max_memory_growth=9))  # fmt: skip
    assert leftover["verdict"]["checks"]["kv_freed"]["passed"] is False
    assert leftover["verdict"]["checks"]["unexpected_errors"]["value"] == 1
    assert leftover["errors"]["timeout"][0]["outcome"] == "timeout"
    unmeasured = summarize(rows, [], None, 40.0, 4, SoakBounds(max_latency_drift=9))
    assert unmeasured["verdict"]["checks"]["memory_growth"]["passed"] is None and unmeasured["verdict"]["passed"]


def test_unreachable_server_exits_2(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cli", "soak", "--url", "http://127.0.0.1:9/v1", "--duration", "5",
         "--request-timeout", "2", "--output-dir", str(tmp_path / "soak")],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2 and "cannot reach" in result.stderr


@pytest.mark.slow
def test_soak_bench_serve_tiny_random_with_preemption(tmp_path: Path) -> None:
    """Our server under a hostile mix, KV pool small enough to preempt: no unexpected outcome, every valid
    request's exact token count, every malformed one a 4xx OpenAI error, KV and running back to 0, memory flat."""
    from tests.engine.entrypoints.serve_helpers import start_server

    server = start_server("--num-gpu-blocks-override", "16", "--max-num-seqs", "32", "--max-request-bytes", "65536")
    try:
        out = tmp_path / "soak"
        result = subprocess.run(
            [sys.executable, "-m", "cli", "soak", "--url", server.url + "/v1",
             "--num-requests", "2000", "--duration", "10m", "--concurrency", "48", "--max-tokens", "6",
             "--oversized-bytes", "70000", "--mix", "long_output=0.005", "--request-timeout", "120",
             "--max-latency-drift", "1000", "--num-windows", "5", "--output-dir", str(out)],
            cwd=REPO, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        summary = json.loads((out / "summary.json").read_text())
        assert result.returncode == 0, result.stdout + result.stderr[-2000:]
        rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
        assert len(rows) == 2000 and summary["verdict"]["passed"]
        outcomes = {r["outcome"] for r in rows}
        assert outcomes <= {"ok", "cancelled", "disconnected", "expected_4xx"} and len(outcomes) == 4
        assert all(r["outcome"] == "expected_4xx" for r in rows if r["kind"] == "malformed"
                   and r["malformed_kind"] != "unknown_field")  # fmt: skip
        checks = summary["verdict"]["checks"]
        assert checks["memory_growth"]["value"] < 0.05 and checks["kv_freed"]["passed"]
        assert (out / "report.html").read_text().count("<tr>") >= 4
        assert "KV cache 16 blocks" in "".join(server.log) and _metric_preemptions(server) > 0
    finally:
        server.stop()


def _metric_preemptions(server: object) -> float:
    from tests.engine.entrypoints.serve_helpers import metric

    return metric(server, "vllm:num_preemptions_total")  # type: ignore[arg-type]
