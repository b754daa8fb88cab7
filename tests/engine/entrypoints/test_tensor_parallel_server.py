"""`bench serve --tensor-parallel-size 2`: the start-up line and /metrics report the TP size, a dead rank makes the
server answer 503 and name the rank in its log, and Ctrl-C to the process group then leaves no process behind.
One server for all of it: starting ranks is the slow part."""

from __future__ import annotations

import os
import signal
import urllib.request
from pathlib import Path

import pytest
from serve_helpers import MODEL, LiveServer, pid_alive, post, start_server, wait_until

pytestmark = pytest.mark.slow


def spawned(server: LiveServer) -> list[int]:
    """The engine process and its ranks: the server's spawned descendants, parents first."""
    return [pid for pid in server.descendants() if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()]


def test_two_ranks_behind_the_server_report_then_fail_with_503_then_shut_down() -> None:
    live = start_server("--tensor-parallel-size", "2", own_group=True)
    children = live.descendants()
    try:
        engine, *ranks = spawned(live)
        assert len(ranks) == 2, "one worker process per rank, under the engine process"
        startup = next(line for line in live.log if line.startswith("Serving "))
        assert "tensor_parallel_size 2, KV cache 512 blocks x 16 = 8192 tokens per rank" in startup
        with urllib.request.urlopen(live.url + "/metrics", timeout=30) as response:
            metrics = response.read().decode()
        assert f'servelab:parallel_config_info{{model_name="{MODEL}",tensor_parallel_size="2"}} 1.0' in metrics
        assert 'num_gpu_blocks="512"' in metrics
        code, answer = post(live.url + "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 4}, key=None)
        assert code == 200 and answer["usage"]["completion_tokens"] == 4

        os.kill(ranks[-1], signal.SIGKILL)
        assert wait_until(lambda: not pid_alive(engine), timeout=30), "the idle engine notices within seconds"
        code, answer = post(live.url + "/v1/completions", {"model": MODEL, "prompt": "hi"}, key=None)
        assert code == 503 and answer["error"]["code"] == "engine_dead"
        assert any("tensor-parallel worker rank" in line and "killed by SIGKILL" in line for line in live.log)
        assert not any(pid_alive(pid) for pid in ranks)
    finally:
        assert live.stop(signal.SIGINT, timeout=60, whole_group=True) == 0  # Ctrl-C in a terminal
    assert wait_until(lambda: not [pid for pid in children if pid_alive(pid)], timeout=15)
