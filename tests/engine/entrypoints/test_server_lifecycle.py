"""`bench serve` lifecycle: signals end streams and leave no orphan process, engine death gives 503, start-up
failures exit non-zero."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from serve_helpers import MODEL, REPO, pid_alive, post, start_server, wait_until

pytestmark = pytest.mark.slow


def _stream_lines(url: str, body: dict[str, Any], first_chunk: threading.Event, lines: list[bytes]) -> None:
    request = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=120) as response:
        for line in response:
            if line.strip():
                lines.append(line.strip())
                first_chunk.set()
    first_chunk.set()


@pytest.mark.parametrize(
    ("sig", "whole_group"),
    [pytest.param(signal.SIGTERM, False, id="sigterm"), pytest.param(signal.SIGINT, True, id="ctrl-c-to-the-group")],
)
def test_signal_ends_streams_and_leaves_no_orphans(sig: int, whole_group: bool) -> None:
    live = start_server("--shutdown-timeout", "0.5", own_group=whole_group)
    children = live.descendants()
    engine_pids = [pid for pid in children if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()]
    assert len(engine_pids) == 1, "the engine runs in one child process"
    first_chunk, lines = threading.Event(), []
    body = {"model": MODEL, "prompt": "count", "max_tokens": 240, "stream": True, "ignore_eos": True}
    reader = threading.Thread(target=_stream_lines, args=(live.url, body, first_chunk, lines))
    reader.start()
    assert first_chunk.wait(120)
    assert live.stop(sig, timeout=60, whole_group=whole_group) == 0
    reader.join(60)
    assert not reader.is_alive()
    assert lines[-1] == b"data: [DONE]"
    ended = json.loads(lines[-2].removeprefix(b"data: "))
    assert ended.get("error", {}).get("code") == "shutting_down" or ended["choices"][0]["finish_reason"] == "length"
    assert not pid_alive(engine_pids[0]), "the engine process exits before the server does"
    # multiprocessing's resource tracker follows within moments
    assert wait_until(lambda: not [pid for pid in children if pid_alive(pid)], timeout=10)


def test_engine_death_gives_503() -> None:
    live = start_server()
    try:
        engine_pids = [pid for pid in live.descendants() if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()]
        assert len(engine_pids) == 1
        first_chunk, lines = threading.Event(), []
        body = {"model": MODEL, "prompt": "count", "max_tokens": 240, "stream": True, "ignore_eos": True}
        reader = threading.Thread(target=_stream_lines, args=(live.url, body, first_chunk, lines))
        reader.start()
        assert first_chunk.wait(120)
        for pid in engine_pids:
            os.kill(pid, signal.SIGKILL)
        reader.join(60)
        assert lines[-1] == b"data: [DONE]"
        assert json.loads(lines[-2].removeprefix(b"data: "))["error"]["code"] == "engine_dead"
        code, answer = post(live.url + "/v1/completions", {"model": MODEL, "prompt": "hi"}, key=None)
        assert code == 503 and answer["error"]["code"] == "engine_dead"
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(live.url + "/health")
        assert caught.value.code == 503
    finally:
        assert live.stop(signal.SIGTERM, timeout=60) == 0


def test_a_killed_server_leaves_no_engine_or_rank_behind() -> None:
    """SIGKILL of the API process alone (no graceful shutdown): the engine process and its tensor-parallel ranks
    follow it, the way a tuner trial's server goes when the tuner is killed."""
    live = start_server("--tensor-parallel-size", "2")
    children = live.descendants()
    assert len([pid for pid in children if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()]) >= 3
    live.process.kill()
    live.process.wait(timeout=30)
    assert wait_until(lambda: not [pid for pid in children if pid_alive(pid)], timeout=30)


def test_start_up_failures_exit_non_zero() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "cli", "serve", "--model", MODEL, "--port", str(port)],
                                cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 1 and f"cannot bind 127.0.0.1:{port}" in result.stderr
    result = subprocess.run([sys.executable, "-m", "cli", "serve", "--model", "/no/such/model.gguf", "--port", "0"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 1 and "cannot load model" in result.stderr
