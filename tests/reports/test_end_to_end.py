"""End to end: `bench sweep` against `bench lab mock-server`, then `bench report` and `bench gate` on the runs.

The mock is a real server process; the bench commands run in this process (typer's CliRunner, as a user's shell
would run them, without paying an interpreter start and the imports once per command)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app

BENCH = [sys.executable, str(Path(__file__).resolve().parents[2] / "cli.py")]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def mock_server(itl_ms: float):
    port = _free_port()
    command = [*BENCH, "lab", "mock-server", "--port", str(port), "--ttft-ms", "20", "--itl-ms", str(itl_ms)]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("mock server did not start") from None
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _sweep(url: str, out: Path) -> Path:
    args = ["sweep", "--url", url, "--model", "mock", "--tokenizer", "tiny-random", "--concurrency", "1,4",
            "--num-prompts", "24", "--input-len", "32", "--output-len", "12", "--slo", "ttft=100,tpot=12",
            "--output-dir", str(out), "--no-report"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.slow
@pytest.mark.serial  # A/A within 25 % on the mock
def test_sweep_report_gate(tmp_path):
    with mock_server(itl_ms=10) as url:
        base = _sweep(url, tmp_path / "base")
        again = _sweep(url, tmp_path / "again")
    with mock_server(itl_ms=14) as url:
        slow = _sweep(url, tmp_path / "slow")

    report = CliRunner().invoke(app, ["report", str(base), str(slow), "--slo", "tpot=12", "--out", str(tmp_path / "r")])
    assert report.exit_code == 0, report.output
    markdown = (tmp_path / "r" / "report.md").read_text()
    assert "**base**" in markdown and "**slow**" in markdown and "TPOT <= 12 ms" in markdown

    def gate(candidate: Path, threshold: str):  # noqa: ANN202 (typer's Result)
        return CliRunner().invoke(app, ["gate", "--baseline", str(base), "--candidate", str(candidate), "--metric",
                                        "tpot_p50", "--max-regression", threshold])

    # Client noise on a shared machine is not in the bootstrap interval: a wide guard band for A/A.
    same = gate(again, "25%")
    assert same.exit_code == 0, same.output
    slower = gate(slow, "25%")  # +40 % programmed inter-token gap
    assert slower.exit_code == 1, slower.output
    assert "❌ regression" in slower.output
