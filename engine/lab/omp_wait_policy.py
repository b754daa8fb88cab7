"""`bench lab omp-wait-policy`: engine output tok/s under each OpenMP wait policy, alone and beside a busy client.

Each cell is one `bench throughput` run of the engine in its own process (OMP_WAIT_POLICY is read when torch
loads, so it cannot change inside one process). "beside a client" runs a process that keeps one core busy
for the whole run, as the load generator and HTTP front end of `bench sweep` do on a small machine. A run
that does not finish within --timeout-s counts as collapsed (reported as 0 tok/s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import typer

POLICIES = ("ACTIVE", "PASSIVE")
BUSY_CLIENT = "while True: pass"
REPO_ROOT = Path(__file__).resolve().parents[2]  # where `python -m cli` finds the bench app


@dataclass
class ThreadsCell:
    omp_wait_policy: str
    beside_client: bool
    output_tokens_per_second: float  # 0.0 when the run timed out
    timed_out: bool


def throughput_command(
    model: str, num_prompts: int, input_len: int, output_len: int, dtype: str, out: Path
) -> list[str]:
    return [
        sys.executable, "-m", "cli", "throughput", "--model", model, "--num-prompts", str(num_prompts),
        "--input-len", str(input_len), "--output-len", str(output_len), "--dtype", dtype, "--device", "cpu",
        "--output-json", str(out),
    ]  # fmt: skip


def run_cell(command: list[str], policy: str, beside_client: bool, timeout_s: float, out: Path) -> ThreadsCell:
    env = {**os.environ, "OMP_WAIT_POLICY": policy}
    client = subprocess.Popen([sys.executable, "-c", BUSY_CLIENT]) if beside_client else None
    try:
        subprocess.run(command, env=env, check=True, timeout=timeout_s, capture_output=True, cwd=REPO_ROOT)
        tok_s = json.loads(out.read_text())["output_tokens_per_second"]
        return ThreadsCell(policy, beside_client, tok_s, False)
    except subprocess.TimeoutExpired:
        return ThreadsCell(policy, beside_client, 0.0, True)
    finally:
        if client is not None:
            client.kill()
            client.wait()


def run_grid(
    command_for: Callable[[Path], list[str]],
    timeout_s: float,
    progress: Callable[[str], None],
    run: Callable[..., ThreadsCell] = run_cell,
) -> list[ThreadsCell]:
    cells = []
    with tempfile.TemporaryDirectory() as tmp:
        for index, (policy, beside) in enumerate((p, b) for p in POLICIES for b in (False, True)):
            progress(f"[{index + 1}/4] OMP_WAIT_POLICY={policy}, {'beside a busy client' if beside else 'alone'}")
            out = Path(tmp) / f"cell{index}.json"
            cells.append(run(command_for(out), policy, beside, timeout_s, out))
    return cells


def omp_wait_policy(
    model: str = typer.Option("smollm2-135m", help="Model alias, HF dir, .gguf file or hub id."),
    num_prompts: int = typer.Option(8, help="Requests per run."),
    input_len: int = typer.Option(64, help="Prompt tokens per request."),
    output_len: int = typer.Option(32, help="Output tokens per request."),
    dtype: str = typer.Option("float32", help="float32 | bfloat16"),
    timeout_s: float = typer.Option(300.0, help="A run longer than this counts as collapsed."),
) -> None:
    """Engine output tok/s with OpenMP threads spinning (ACTIVE) or sleeping (PASSIVE) while they wait, alone and
    beside a process that keeps one core busy; four `bench throughput` runs side by side."""
    if min(num_prompts, input_len, output_len) < 1 or timeout_s <= 0:
        raise typer.BadParameter("--num-prompts, --input-len, --output-len and --timeout-s must be positive")
    cells = run_grid(
        lambda out: throughput_command(model, num_prompts, input_len, output_len, dtype, out), timeout_s, typer.echo
    )
    typer.echo(f"{'OMP_WAIT_POLICY':<16}{'alone':>14}{'beside client':>16}{'ratio':>8}")
    for policy in POLICIES:
        alone, beside = (next(c for c in cells if c.omp_wait_policy == policy and c.beside_client == b) for b in (0, 1))
        shown = [
            f"> {timeout_s:.0f} s" if c.timed_out else f"{c.output_tokens_per_second:.1f} tok/s"
            for c in (alone, beside)
        ]
        ratio = beside.output_tokens_per_second / alone.output_tokens_per_second if not alone.timed_out else 0.0
        typer.echo(f"{policy:<16}{shown[0]:>14}{shown[1]:>16}{ratio:>8.2f}")
