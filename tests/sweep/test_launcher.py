"""Launching a server subprocess: health wait, clear start errors with the log tail, clean shutdown."""

from __future__ import annotations

import shlex
import sys
import urllib.request
from pathlib import Path

import pytest

from sweep.launcher import ServerStartError, builtin_command, knob_flags, launch, template_command


def test_flags_and_templates() -> None:
    knobs = {"max_num_seqs": 8, "enable_prefix_caching": False, "enable_chunked_prefill": True, "dtype": None}
    assert knob_flags(knobs) == ["--max-num-seqs", "8", "--no-enable-prefix-caching", "--enable-chunked-prefill"]
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
    template = f"{shlex.quote(sys.executable)} -m sweep.mock_server --port {{port}} --ttft-ms {{ttft_ms}}"
    server = launch("mock", {"ttft_ms": 1}, tmp_path / "server.log", template=template, health_timeout_s=60)
    with server:
        assert urllib.request.urlopen(server.url + "/models", timeout=5).status == 200
    assert server.process.poll() is not None  # SIGTERM ended it
    assert "sweep.mock_server" in (tmp_path / "server.log").read_text()  # the command heads the log


def test_start_errors_carry_the_log_tail(tmp_path: Path) -> None:
    crash = f"{shlex.quote(sys.executable)} -c \"print('engine exploded: out of memory'); raise SystemExit(3)\""
    with pytest.raises(ServerStartError, match="(?s)exited with code 3.*engine exploded: out of memory"):
        launch("m", {}, tmp_path / "a.log", template=crash).start()
    hang = f"{shlex.quote(sys.executable)} -c \"import time; print('loading', flush=True); time.sleep(60)\""
    server = launch("m", {}, tmp_path / "b.log", template=hang, health_timeout_s=1.0)
    with pytest.raises(ServerStartError, match="(?s)did not answer.*loading"):
        server.start()
    assert server.process.poll() is not None  # the hung server was killed, not leaked
