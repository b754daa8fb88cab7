"""`bench sweep --url` against a real `vllm serve` (vLLM's CPU build, the default model exported to HF): every
request completes with its usage read, vLLM's /metrics land in each point (KV usage, queue, preemptions, prefix
cache, n-gram speculation), and the prefix cache is reset before each point through vLLM's dev-mode route."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sweep.run.launcher import ServerProcess, free_port
from tests.sweep.real_vllm_helpers import ROOT, VLLM, VLLM_CPU_ENV, VLLM_MODEL, requires_real_vllm

SPECULATIVE = '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}'


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """`vllm serve` with --enforce-eager (about a minute to healthy on two cores; torch.compile would add two)."""
    port = free_port()
    command = [str(VLLM), "serve", str(VLLM_MODEL), "--host", "127.0.0.1", "--port", str(port),
               "--served-model-name", "smollm2-135m", "--dtype", "float32", "--enforce-eager",
               "--max-model-len", "1024", "--speculative-config", SPECULATIVE]  # fmt: skip
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    server = ServerProcess(command=command, host="127.0.0.1", port=port, log_path=log, health_timeout_s=600,
                           env=VLLM_CPU_ENV)
    with server:
        yield server


@requires_real_vllm
def test_a_sweep_of_real_vllm_reads_usage_its_metrics_and_resets_its_prefix_cache(
    vllm_server: ServerProcess, tmp_path: Path
) -> None:
    out = tmp_path / "sweep"
    root = f"http://{vllm_server.host}:{vllm_server.port}"  # vLLM's --base-url spelling: the sweep adds /v1
    done = subprocess.run([
        sys.executable, "-m", "cli", "sweep", "--url", root, "--model", "smollm2-135m", "--tokenizer",
        str(VLLM_MODEL), "--workload", "copy-heavy", "--concurrency", "1,2", "--num-prompts", "4", "--output-len",
        "24", "--ignore-eos", "--temperature", "0", "--reset-prefix-cache", "--no-calibration", "--no-report",
        "--output-dir", str(out),
    ], cwd=ROOT, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for label in ("c0001", "c0002"):
        point = json.loads((out / "points" / f"{label}.json").read_text())
        assert point["completed"] == 4 and point["failed"] == 0
        assert point["total_output_tokens"] == 4 * 24  # ignore_eos honoured, and counted from vLLM's usage
        client = point["fidelity"]["client"]
        assert client["usage_reported"] == 4 and client["prefix_cache_reset"] is True
        assert point["prefix_cache_queries"] > 0 and point["max_kv_cache_usage_perc"] > 0
        assert point["num_preemptions"] == 0 and point["max_num_requests_waiting"] >= 0
        assert point["generation_tokens"] == 4 * 24
        assert point["spec_decode_num_drafts"] > 0  # n-gram drafts on copy-heavy text: vLLM's counters scraped
        accepted, drafted = point["spec_decode_accepted_tokens"], point["spec_decode_draft_tokens"]
        assert drafted > 0 and point["spec_decode_acceptance_rate"] == pytest.approx(100 * accepted / drafted)
        assert point["median_tpot_ms"] > 0 and point["median_ttft_ms"] > 0
    log = vllm_server.log_path.read_text()
    assert log.count("POST /reset_prefix_cache") >= 2  # before each point
