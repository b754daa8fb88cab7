"""Helpers for the live-server tests: `bench serve` subprocesses: started on a free port, torn down with SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from engine.config import knob_args

REPO = Path(__file__).resolve().parents[3]
API_KEY = "test-key"
MODEL = "tiny-random"
# Small and float32: the greedy outputs are compared with the offline engine built with the same knobs.
ENGINE_KNOBS = {"dtype": "float32", "max_model_len": 256, "num_gpu_blocks_override": 512, "max_num_seqs": 64}
_STARTUP = re.compile(r"Serving \S+ .* at (http://\S+)")


@dataclass
class LiveServer:
    process: subprocess.Popen[str]
    url: str = ""
    log: list[str] = field(default_factory=list)

    def descendants(self) -> list[int]:
        return _descendants(self.process.pid)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0, whole_group: bool = False) -> int:
        """Signal the server (whole_group: its process group too, as Ctrl-C in a terminal does) and wait."""
        if self.process.poll() is None:
            if whole_group:
                os.killpg(self.process.pid, sig)
            else:
                self.process.send_signal(sig)
        return self.process.wait(timeout=timeout)


def _descendants(pid: int) -> list[int]:
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                found.append(child)
                frontier.append(child)
    return found


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def start_server(*extra: str, timeout: float = 600.0, own_group: bool = False, model: str = MODEL) -> LiveServer:
    """own_group: the server leads its own process group (so a test can signal the group like a terminal)."""
    command = [sys.executable, "-m", "cli", "serve", "--model", model, "--port", "0", *knob_args(ENGINE_KNOBS), *extra]
    process = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=own_group,
    )  # fmt: skip
    server = LiveServer(process)
    ready = threading.Event()

    def pump() -> None:  # keep draining stderr so the server never blocks on a full pipe
        assert process.stderr is not None
        for line in process.stderr:
            server.log.append(line)
            match = _STARTUP.search(line)
            if match:
                server.url = match.group(1)
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    ready.wait(timeout)
    if not server.url:
        server.stop(signal.SIGKILL)
        raise RuntimeError("bench serve did not start:\n" + "".join(server.log[-40:]))
    with urllib.request.urlopen(server.url + "/health", timeout=30) as response:
        assert response.status == 200
    return server


def wait_until(predicate: object, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


def post(url: str, body: Any, *, key: str | None = API_KEY, raw: bytes | None = None) -> tuple[int, Any]:
    data = raw if raw is not None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def metric(server: LiveServer, name: str) -> float:
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    match = re.search(rf'^{re.escape(name)}\{{model_name="{MODEL}"\}} (\S+)$', text, re.MULTILINE)
    assert match, f"{name} missing from /metrics"
    return float(match.group(1))


async def read_chunks_then_disconnect(session: aiohttp.ClientSession, url: str, body: Any, num_chunks: int) -> None:
    """Stream `body` from `url`, then close the connection after `num_chunks` data chunks."""
    async with session.post(url, json=body, headers={"Authorization": f"Bearer {API_KEY}"}) as response:
        assert response.status == 200
        seen = 0
        async for line in response.content:
            seen += line.startswith(b"data: {")
            if seen == num_chunks:
                break  # leaving the block closes the connection mid-stream
