"""`bench sweep` against a real third-party OpenAI server: llama.cpp's, from the `llama-cpp-python[server]`
package (a test dependency, 0.3.36), serving the default model's GGUF.

That server runs one request at a time; by default a new request interrupts the one streaming (its
`interrupt_requests` setting), which breaks every concurrent stream, so it is started with
`--interrupt_requests False` (requests wait for the model instead). It streams no usage, not even with
`stream_options.include_usage` (only its non-streaming responses carry usage), so the sweep's token counts come
from re-tokenising the streamed text, as vLLM's client does without usage."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import sweep
from engine.model_files import smollm2_gguf_path
from sweep.compare.targets import llama_cpp_command
from sweep.run.launcher import ServerProcess, free_port

REPO = Path(__file__).resolve().parents[3]
START_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Started as a `bench compare` llama.cpp target starts it (its command, ready once /v1/models answers)."""
    port = free_port()
    log = tmp_path_factory.mktemp("llama") / "server.log"
    command = llama_cpp_command(smollm2_gguf_path(), "smollm2", port, threads=2, n_ctx=1024)
    server = ServerProcess(command=command, host="127.0.0.1", port=port, log_path=log,
                           health_timeout_s=START_TIMEOUT_S, health_path="/v1/models")  # fmt: skip
    with server:
        yield server


@pytest.mark.slow
def test_bench_sweep_against_llama_cpp(llama_server: ServerProcess, tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli",
            "sweep",
            "--url",
            llama_server.url,
            "--model",
            "smollm2",
            "--tokenizer",
            "smollm2-135m",
            "--concurrency",
            "1,2",
            "--num-prompts",
            "4",
            "--input-len",
            "48",
            "--output-len",
            "8",
            "--temperature",
            "0",
            "--no-report",
            "--output-dir",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    crashed = llama_server.process.poll()
    if done.returncode != 0 and crashed is not None and crashed < 0:
        # llama.cpp's own server killed by a signal (its pip-built binary has died with SIGSEGV on some hosts'
        # CPUs on its first completion): a fault of that build on this host, not of the sweep; said, not hidden.
        pytest.skip(f"llama.cpp's server died with signal {-crashed}: {llama_server.log_tail()[-500:]}")
    assert done.returncode == 0, done.stderr[-3000:]
    results = sweep.load_results(out)
    points, rows = results.points, results.requests
    assert list(points["completed"]) == [4, 4] and list(points["failed"]) == [0, 0]  # no request fails
    for name in ("median_ttft_ms", "median_tpot_ms", "median_e2el_ms", "output_throughput"):
        assert (points[name] > 0).all(), name  # metrics come out
    for label in ("c0001", "c0002"):
        client = json.loads((out / "points" / f"{label}.json").read_text())["fidelity"]["client"]
        assert client["usage_reported"] == 0  # no usage in llama.cpp's streams: the client's counts stand in
        assert client["chunks_vs_retokenized_mismatch"] >= 0 and "retokenized_tokens_per_chunk_mean" in client
    assert (rows["output_tokens"] == rows["client_output_tokens"]).all()  # re-tokenised, as vLLM without usage
    assert (rows["prompt_tokens"] == 48).all()  # the synthesized prompts' exact length under the same tokenizer
    # max_tokens=8 (ignore_eos is not an option there): re-tokenising 8 generated tokens gives about 8
    assert rows["output_tokens"].between(5, 9).all()
