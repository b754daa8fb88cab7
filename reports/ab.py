"""`bench ab`: an interleaved A/B sweep in one job, then the gate on it.

Both servers run at once (each on its own port); the sweep alternates between them point by point, and each
repeat swaps which side goes first (ABBA...), so both see the same machine state: a drift of the machine over
the job lands on both sides instead of on one. A side is a git ref of this repository (checked out into a
temporary worktree and served by its own `bench serve`) or a launch-command template for any server (see
sweep/launcher.py). Each side writes an ordinary `bench sweep` run directory with `--repeats`, so the two
runs can be reported and gated again later.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from engine.config import knob_args
from sweep.run.repeats import repeat_order

if TYPE_CHECKING:
    from sweep.run.sweeper import SweepConfig

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Side:
    """One side of the comparison: exactly one of `ref` (a git ref of this repository) or `command` (a launch
    template); `extra_args` are appended to its server command (e.g. `--inject-step-delay-ms 4`)."""

    name: str
    ref: str | None = None
    command: str | None = None
    extra_args: str = ""

    def __post_init__(self) -> None:
        if (self.ref is None) == (self.command is None):
            raise ValueError(f"give the {self.name} exactly one of a git ref or a launch command")


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ValueError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


@contextmanager
def checkout(ref: str) -> Iterator[Path]:
    """A temporary detached worktree of `ref`, removed afterwards."""
    try:
        commit = _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except ValueError:
        raise ValueError(f"{ref!r} is not a commit of the repository at {REPO_ROOT}") from None
    path = Path(tempfile.mkdtemp(prefix=f"servelab-ab-{commit[:8]}-"))
    _git("worktree", "add", "--detach", "--force", str(path), commit)
    try:
        yield path
    finally:
        _git("worktree", "remove", "--force", str(path))


def _escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def side_template(side: Side, knobs: dict[str, Any], worktree: Path | None) -> str:
    """The side's launch template. A ref runs its worktree's `bench serve` (`python -P` keeps the current
    directory off sys.path, so PYTHONPATH picks the worktree's code over the installed one)."""
    extra = shlex.split(side.extra_args)
    if side.command is not None:
        return side.command + "".join(" " + shlex.quote(_escape(a)) for a in extra)
    assert worktree is not None
    argv = ["env", f"PYTHONPATH={worktree}", sys.executable, "-P", "-m", "cli", "serve"]
    tail = [*knob_args(knobs), *extra]
    return " ".join(shlex.quote(_escape(a)) for a in argv) + " {model} --host {host} --port {port} " + " ".join(
        shlex.quote(_escape(a)) for a in tail
    )


def run_ab(base: SweepConfig, baseline: Side, candidate: Side, console: Console | None = None) -> tuple[Path, Path]:
    """Sweep both sides interleaved into `base.output_dir/{baseline,candidate}`; returns the two run directories."""
    from sweep.run.sweeper import Sweeper  # loads the HTTP client: only when sweeping

    console = console or Console(stderr=True)
    if base.url is not None:
        raise ValueError("bench ab launches both servers itself; it takes no --url")
    if base.max_load_under_slo:
        raise ValueError("bench ab sweeps fixed loads; it cannot search --max-load-under-slo")
    with ExitStack() as stack:
        sweepers = []
        for side in (baseline, candidate):
            worktree = stack.enter_context(checkout(side.ref)) if side.ref is not None else None
            config = replace(
                base,
                output_dir=base.output_dir / side.name,
                launch_template=side_template(side, base.engine_knobs, worktree),
                command=f"{base.command} [{side.name}: {side.ref or side.command} {side.extra_args}]".strip(),
            )
            console.print(f"[bold]{side.name}[/bold]: starting {side.ref or side.command}")
            sweepers.append(stack.enter_context(Sweeper(config, console)))
        for repeat, value in repeat_order(base.values, base.repeats):
            order = sweepers if repeat % 2 == 0 else sweepers[::-1]
            for sweeper in order:
                console.print(f"[dim]{Path(sweeper.config.output_dir).name}[/dim]", end=" ")
                sweeper.measure_repeat(value, repeat)
    return base.output_dir / baseline.name, base.output_dir / candidate.name
