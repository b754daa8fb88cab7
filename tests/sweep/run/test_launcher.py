"""Launching a server subprocess: health wait, clear start errors with the log tail, clean shutdown."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from engine.config import knob_args
from sweep.run.launcher import ServerStartError, builtin_command, launch, template_command


def test_flags_and_templates() -> None:
    knobs = {"max_num_seqs": 8, "enable_prefix_caching": False, "enable_chunked_prefill": True, "dtype": None}
    assert knob_args(knobs) == ["--max-num-seqs", "8", "--no-enable-prefix-caching", "--enable-chunked-prefill"]
    command = builtin_command("tiny-random", "127.0.0.1", 9, {"block_size": 16})
    assert command[1:] == [
        "-m",
        "cli",
        "serve",
        "tiny-random",
        "--host",
        "127.0.0.1",
        "--port",
        "9",
        "--block-size",
        "16",
    ]
    template = "vllm serve {model} --port {port} --max-num-seqs {max_num_seqs} --prefix {enable_prefix_caching}"
    assert template_command(template, "m", "h", 5, {"max_num_seqs": 4, "enable_prefix_caching": True}) == [
        "vllm",
        "serve",
        "m",
        "--port",
        "5",
        "--max-num-seqs",
        "4",
        "--prefix",
        "true",
    ]
    with pytest.raises(ValueError, match="max_num_seqs"):
        template_command(template, "m", "h", 5, {})


def test_template_launch_health_and_stop(tmp_path: Path) -> None:
    template = f"{shlex.quote(sys.executable)} -m sweep.mock.server --port {{port}} --ttft-ms {{ttft_ms}}"
    server = launch("mock", {"ttft_ms": 1}, tmp_path / "server.log", template=template, health_timeout_s=60)
    with server:
        assert urllib.request.urlopen(server.url + "/models", timeout=5).status == 200
    assert server.process.poll() is not None  # SIGTERM ended it
    assert "sweep.mock.server" in (tmp_path / "server.log").read_text()  # the command heads the log


def test_start_errors_carry_the_log_tail(tmp_path: Path) -> None:
    crash = f"{shlex.quote(sys.executable)} -c \"print('engine exploded: out of memory'); raise SystemExit(3)\""
    with pytest.raises(ServerStartError, match="(?s)exited with code 3.*engine exploded: out of memory"):
        launch("m", {}, tmp_path / "a.log", template=crash).start()
    hang = f"{shlex.quote(sys.executable)} -c \"import time; print('loading', flush=True); time.sleep(60)\""
    server = launch("m", {}, tmp_path / "b.log", template=hang, health_timeout_s=1.0)
    with pytest.raises(ServerStartError, match="(?s)did not answer.*loading"):
        server.start()
    assert server.process.poll() is not None  # the hung server was killed, not leaked


def _alive(pid: int) -> bool:
    """Running, not a zombie awaiting a reaper (the orphaned server is reparented)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def test_the_server_dies_with_the_process_that_launched_it(tmp_path: Path) -> None:
    parent = f"""
import os, shlex, signal, sys
from pathlib import Path
from sweep.run.launcher import launch
template = shlex.quote(sys.executable) + " -m sweep.mock.server --port {{port}}"
server = launch("mock", {{}}, Path({str(tmp_path / "server.log")!r}), template=template, health_timeout_s=60).start()
print(server.process.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # no cleanup runs: only the kernel can stop the server now
"""
    result = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, timeout=120)
    server_pid = int(result.stdout.split()[0])
    try:
        deadline = time.monotonic() + 30
        while _alive(server_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(server_pid), "the orphaned server kept running"
    finally:
        if _alive(server_pid):
            os.killpg(server_pid, signal.SIGKILL)
