"""A trial's engine and its load points: the sweep's launcher and `Sweeper`, per trial.

Each trial starts its engine once (the built-in `bench serve` or an external launch template), then each repeat
is one `Sweeper` run directory `trial_NNNN/repeatR/` against it (the results contract: config.json, points/,
requests.jsonl, summary.csv), with the engine's `server.log` in the trial directory. A start failure, or an
engine that dies while it is measured, raises `Infeasible` with the log's tail. The engine's pid is written to
`engine.pid`, so a later worker can end an engine whose tuner was killed (`reap_orphan_engine`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweep.tune.objective import Infeasible, MeasurePoint
from sweep.tune.space import fill_template

ENGINE_PID = "engine.pid"


@dataclass
class TrialWorkload:
    """What every trial measures: the `bench sweep` workload flags, SLO and point size."""

    model: str
    workload: str = "random"
    input_len: int | None = None  # generated workloads only: shipped mixes and traces reject length options
    output_len: int | None = None
    num_prompts: int = 32
    num_warmups: int = 1
    endpoint: str = "completions"
    seed: int = 0
    tokenizer: str | None = None
    slo: dict[str, float] = field(default_factory=dict)  # {"ttft_ms": .., "tpot_ms": ..}
    percentiles: tuple[float, ...] = (50.0, 90.0, 99.0)
    load_mode: str = "concurrency"
    burstiness: float = 1.0
    cost_per_hour: float | None = None  # USD per instance-hour: points get cost_per_million_output_tokens
    gpus_per_instance: int = 1


def process_start(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def engine_dead_behind_server(host: str, port: int) -> bool:
    """The server is up but its engine is gone: `bench serve` (and vLLM) answer /health with 503 then."""
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(f"http://{host}:{port}/health", timeout=10).close()
    except urllib.error.HTTPError as err:
        return err.code == 503
    except OSError:  # unreachable: the process check decides
        return False
    return False


def reap_orphan_engine(trial_dir: Path) -> bool:
    """End the engine a killed tuner left behind in `trial_dir` (checked by pid and start time); True if ended."""
    try:
        record = json.loads((trial_dir / ENGINE_PID).read_text())
    except (OSError, ValueError):
        return False
    pid = int(record["pid"])
    if process_start(pid) is None or process_start(pid) != record.get("start"):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
        for _ in range(60):
            if process_start(pid) != record.get("start"):
                return True
            time.sleep(0.25)
        os.killpg(pid, signal.SIGKILL)
    return True


class EngineBackend:
    """`TrialBackend` for real engines."""

    def __init__(self, workload: TrialWorkload, launch_command: str | None = None,
                 extra_knobs: dict[str, Any] | None = None, startup_timeout_s: float = 600.0) -> None:
        self.workload, self.launch_command = workload, launch_command
        self.extra_knobs = extra_knobs or {}
        self.startup_timeout_s = startup_timeout_s

    def _server(self, knobs: dict[str, Any], trial_dir: Path) -> Any:
        from sweep.launcher import ServerProcess, builtin_command, free_port

        host = "127.0.0.1"
        port = free_port(host)
        model = self.workload.model
        all_knobs = {**self.extra_knobs, **knobs}
        if self.launch_command:
            command = shlex.split(fill_template(self.launch_command, model, all_knobs, port=port, host=host))
        else:
            command = builtin_command(model, host, port, all_knobs)
        return ServerProcess(command=command, host=host, port=port, log_path=trial_dir / "server.log",
                             health_timeout_s=self.startup_timeout_s)

    @contextlib.contextmanager
    def launch(self, knobs: dict[str, Any], trial_dir: Path) -> Iterator[Callable[[int], MeasurePoint]]:
        from sweep.launcher import ServerStartError

        trial_dir.mkdir(parents=True, exist_ok=True)
        server = self._server(knobs, trial_dir)
        try:
            server.start()
        except ServerStartError as err:
            raise Infeasible(f"engine failed to start: {err}") from err
        except OSError as err:
            raise Infeasible(f"engine failed to start: {shlex.join(server.command)}: {err}") from err
        assert server.process is not None
        pid = server.process.pid
        (trial_dir / ENGINE_PID).write_text(json.dumps({"pid": pid, "start": process_start(pid)}))
        with contextlib.ExitStack() as sweepers:
            try:
                yield lambda repeat: self._measure(sweepers, server, knobs, trial_dir / f"repeat{repeat}")
            finally:
                sweepers.close()
                server.stop()
                (trial_dir / ENGINE_PID).unlink(missing_ok=True)

    def _measure(self, sweepers: contextlib.ExitStack, server: Any, knobs: dict[str, Any],
                 run_dir: Path) -> MeasurePoint:
        """A sweep run directory against the trial's engine; `measure(load)` runs one point of it."""
        from rich.console import Console

        from sweep.runner import WorkloadConfig
        from sweep.sweeper import SweepConfig, Sweeper

        w = self.workload
        config = SweepConfig(
            output_dir=run_dir, mode=w.load_mode, url=server.url, model=w.model, tokenizer=w.tokenizer,
            engine_knobs={**self.extra_knobs, **knobs}, launch_template=self.launch_command,
            workload=WorkloadConfig(workload=w.workload, input_len=w.input_len, output_len=w.output_len,
                                    seed=w.seed, endpoint=w.endpoint, max_model_len=knobs.get("max_model_len")),
            num_prompts=w.num_prompts, burstiness=w.burstiness, num_warmups=w.num_warmups, slo=w.slo or None,
            percentiles=list(w.percentiles), resume=True, command=shlex.join(server.command),
            cost_per_hour=w.cost_per_hour, gpus_per_instance=w.gpus_per_instance,
        )
        # The tuner's own progress owns the terminal: the sweep's per-point bars and rows stay quiet.
        try:
            sweeper = sweepers.enter_context(Sweeper(config, console=Console(stderr=True, quiet=True)))
        except RuntimeError:  # e.g. the engine died right after /health: that is the configuration's failure
            self._check_alive(server)
            raise
        assert sweeper.writer is not None
        sweeper.writer.config["target"]["backend"] = "openai" if self.launch_command else "servelab"
        sweeper.writer.save_config()

        def measure(load: float) -> dict[str, Any]:
            if w.load_mode == "concurrency":  # at least one prompt per stream, or the point measures less load
                config.num_prompts = max(w.num_prompts, int(load))
            point = sweeper.measure(load)
            self._check_alive(server)
            return point

        return measure

    @staticmethod
    def _check_alive(server: Any) -> None:
        if server.process is not None and (code := server.process.poll()) is not None:
            tail = server.log_tail()
            oom = "out of memory" in tail.lower() or "outofmemory" in tail.lower()
            raise Infeasible(f"engine {'ran out of memory' if oom else 'crashed'} (exit code {code}) "
                             f"while measured; log {server.log_path}:\n{tail}")
        if server.process is not None and engine_dead_behind_server(server.host, server.port):
            raise Infeasible(f"the engine behind the server died while measured (/health answers 503, e.g. a "
                             f"tensor-parallel rank died); log {server.log_path}:\n{server.log_tail()}")
