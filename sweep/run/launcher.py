"""Start an OpenAI server as a subprocess, wait for /health, shut it down cleanly.

The built-in engine runs as `bench serve MODEL --port P --<knob> V ...` (vLLM's flag names). Any other
server comes from a launch-command template such as `vllm serve {model} --port {port} --max-num-seqs
{max_num_seqs}`: `{port}`, `{host}`, `{model}` and every knob are substituted. The log goes to a file (the
run directory's server.log); a start that fails or times out raises with the log's tail. On Linux the server
gets SIGTERM if the process that launched it dies (prctl PR_SET_PDEATHSIG), so a killed sweep or tuner never
leaves an engine holding the port and the memory.
"""

from __future__ import annotations

import ctypes
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.config import knob_args

LOG_TAIL_LINES = 40
PR_SET_PDEATHSIG = 1


class ServerStartError(RuntimeError):
    """The server exited or never became healthy; the message carries its log tail."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def die_with_parent() -> Callable[[], None] | None:
    """A Popen preexec_fn that has the child SIGTERMed when this process dies (Linux; None elsewhere).

    The kernel ties the signal to the launching *thread*: launch from a thread that outlives the server.
    """
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # resolved here, in the parent: the forked child only calls it
    parent_pid = os.getpid()

    def set_parent_death_signal() -> None:
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return set_parent_death_signal


def builtin_command(model: str, host: str, port: int, knobs: dict[str, Any]) -> list[str]:
    return [sys.executable, "-m", "cli", "serve", model, "--host", host, "--port", str(port), *knob_args(knobs)]


def escape(text: str) -> str:
    """`text` inside a launch template: its braces are literal."""
    return text.replace("{", "{{").replace("}", "}}")


def template_command(template: str, model: str, host: str, port: int, knobs: dict[str, Any]) -> list[str]:
    values = {k: ("true" if v is True else "false" if v is False else v) for k, v in knobs.items()}
    try:
        return shlex.split(template.format(model=model, host=host, port=port, **values))
    except KeyError as e:
        raise ValueError(f"launch template {template!r} names {e} but no such knob was given") from None


@dataclass
class ServerProcess:
    command: list[str]
    host: str
    port: int
    log_path: Path
    health_timeout_s: float = 600.0
    env: dict[str, str] = field(default_factory=dict)
    health_path: str = "/health"  # a server without /health (llama.cpp's) is ready once another route answers 200
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def start(self) -> ServerProcess:
        """Spawn the server and wait until it is healthy (stopping it if it never is)."""
        self.spawn()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def spawn(self) -> ServerProcess:
        """Start the process without waiting for it to be healthy (`wait_healthy` does that)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"$ {shlex.join(self.command)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
                start_new_session=True,  # its own process group: shutdown reaches any workers it forks
                preexec_fn=die_with_parent(),
                cwd=Path(__file__).resolve().parent.parent,
            )
        return self

    def wait_healthy(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.health_timeout_s
        health = f"http://{self.host}:{self.port}{self.health_path}"
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                raise ServerStartError(
                    f"the server exited with code {code} before it was healthy; log {self.log_path}:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(health, timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.5)
        raise ServerStartError(
            f"the server did not answer {health} within {self.health_timeout_s:.0f} s; "
            f"log {self.log_path}:\n{self.log_tail()}"
        )

    def stop(self, grace_s: float = 15.0) -> int | None:
        """SIGTERM the server's process group, then SIGKILL after `grace_s`; returns the exit code."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            return self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            return self.process.wait()
        except ProcessLookupError:
            return self.process.wait()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def launch(
    model: str,
    knobs: dict[str, Any],
    log_path: Path,
    template: str | None = None,
    host: str = "127.0.0.1",
    health_timeout_s: float = 600.0,
    health_path: str = "/health",
) -> ServerProcess:
    """Build the command (built-in engine, or `template`) on a free port; `with launch(...) as server:`."""
    port = free_port(host)
    command = (
        template_command(template, model, host, port, knobs) if template else builtin_command(model, host, port, knobs)
    )
    return ServerProcess(
        command=command, host=host, port=port, log_path=log_path, health_timeout_s=health_timeout_s,
        health_path=health_path,
    )
