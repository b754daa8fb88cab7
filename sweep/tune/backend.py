"""A trial's engine and its load points: the sweep's launcher and `Sweeper`, per trial.

Each trial starts its engine once (the built-in `bench serve` or an external launch template), then each repeat
is one `Sweeper` run directory `trial_NNNN/repeatR/` against it (the results contract: config.json, points/,
requests.jsonl, summary.csv), with the engine's `server.log` and its start-up time (`engine_start.json`: spawn to
healthy, kept apart from the measurement) in the trial directory. A start failure, an engine that crashes, runs
out of memory or stops answering while it is measured, or a trial that runs past its timeout (its engine is then
killed) raises `Infeasible` with the reason, the log's tail and the engine's own error line (`engine_error`:
vLLM's `ValueError: ...` when it refuses its configuration). The engine's pid is written to `engine.pid`
(atomically) as soon as it is spawned, so a later worker can end an engine whose tuner was killed
(`reap_orphan_engine`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from sweep.run.results import write_atomic
from sweep.run.run_info import TargetUnhealthy
from sweep.tune.engines import log_error_line
from sweep.tune.objective import Infeasible, MeasurePoint
from sweep.tune.space import fill_template

if TYPE_CHECKING:
    from sweep.point.runner import WorkloadConfig
    from sweep.run.sweeper import SweepConfig

ENGINE_PID = "engine.pid"
ENGINE_START = "engine_start.json"  # {"startup_s": spawn to healthy}: the engine's start, apart from the measurement


def startup_seconds(trial_dir: Path) -> float | None:
    """How long the trial's engine took from spawn to healthy (None if it never became healthy)."""
    try:
        return float(json.loads((trial_dir / ENGINE_START).read_text())["startup_s"])
    except (OSError, ValueError, KeyError):
        return None


@dataclass
class TrialWorkload:
    """What every trial measures: the `bench sweep` workload flags, SLO and point size."""

    model: str
    workload: str = "random"
    input_len: int | None = None  # generated workloads only: shipped mixes and traces reject length options
    output_len: int | None = None
    num_prompts: int | None = 32  # None: --duration decides (the sweep's duration pool)
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
    warmup_seconds: float = 0.0  # a steady window (sweep.point.steady_state): the trial reads the window's figures
    cooldown_seconds: float = 0.0
    steady_window: str | None = None  # "auto": detect each point's window
    # the sweep's load shape (sweep.run.load_shape.LoadShape): "replay" is a load mode of its own
    duration: float | None = None  # seconds of sending per point
    turns: int = 1  # > 1: multi-turn sessions of synthesized turns; the load counts sessions
    think_time_s: float = 0.0
    conversations: str | None = None  # a conversation file: sessions of real conversations
    structured_output: str | None = None
    structured_output_shape: str | None = None
    ramp_up: tuple[str, float, float] | None = None  # one rate point that ramps (vLLM's --ramp-up-strategy)
    rate_curve: list[float] | None = None  # window rates shaping every rate point

    def workload_config(self, max_model_len: int | None) -> WorkloadConfig:
        """The sweep's workload of a trial whose engine has `max_model_len`."""
        from sweep.point.runner import WorkloadConfig

        return WorkloadConfig(workload=self.workload, input_len=self.input_len, output_len=self.output_len,
                              seed=self.seed, endpoint=self.endpoint, max_model_len=max_model_len,
                              structured_output=self.structured_output,
                              structured_output_shape=self.structured_output_shape,
                              conversations=self.conversations)  # fmt: skip

    def prompts_for(self, load: float) -> int | None:
        """Requests one point at `load` sends: in closed loop at least one prompt per stream (a session's turns
        per stream with --turns), or the point measures less load; None with --duration alone."""
        if self.num_prompts is None or self.load_mode != "concurrency":
            return self.num_prompts
        return max(self.num_prompts, int(load) * self.turns)

    def sweep_config(self, run_dir: Path, url: str, knobs: dict[str, Any], **target: Any) -> SweepConfig:
        """The sweep a trial runs against its engine at `url` (knobs: the trial's, pinned ones included);
        `target` adds the SweepConfig fields of the launched engine (launch_template, command, devices_used).
        Validated on construction: the tuner builds one before any trial, so a bad shape fails once."""
        from sweep.run.sweeper import SweepConfig

        return SweepConfig(
            output_dir=run_dir, mode=self.load_mode, values=[self.ramp_up[2]] if self.ramp_up else [1.0],
            url=url, model=self.model, tokenizer=self.tokenizer, engine_knobs=knobs,
            workload=self.workload_config(knobs.get("max_model_len")), num_prompts=self.num_prompts,
            duration=self.duration, burstiness=self.burstiness, num_warmups=self.num_warmups, slo=self.slo or None,
            percentiles=list(self.percentiles), resume=True, cost_per_hour=self.cost_per_hour,
            gpus_per_instance=self.gpus_per_instance, warmup_seconds=self.warmup_seconds,
            cooldown_seconds=self.cooldown_seconds, steady_window=self.steady_window, ramp_up=self.ramp_up,
            turns=self.turns, think_time_s=self.think_time_s, rate_curve=self.rate_curve, **target,
        )  # fmt: skip


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


class TrialTimeout:
    """Kills the trial's engine (SIGKILL to its process group) once the trial has run `timeout_s`: whatever the
    trial then waits on (health checks, streams) fails at once, and `fired` tells the trial why."""

    def __init__(self, server: Any, timeout_s: float | None) -> None:
        self.server, self.timeout_s = server, timeout_s
        self.fired = False
        self._timer: threading.Timer | None = None

    def __enter__(self) -> TrialTimeout:
        if self.timeout_s:
            self._timer = threading.Timer(self.timeout_s, self._fire)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _fire(self) -> None:
        self.fired = True
        process = self.server.process
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)

    def check(self) -> None:
        if self.fired:
            raise Infeasible(f"the trial ran past --trial-timeout {self.timeout_s:g} s and its engine was killed; "
                             f"log {self.server.log_path}:\n{self.server.log_tail()}", cause="timeout")


class EngineBackend:
    """`TrialBackend` for real engines."""

    def __init__(self, workload: TrialWorkload, launch_command: str | None = None,
                 extra_knobs: dict[str, Any] | None = None, startup_timeout_s: float = 600.0,
                 trial_timeout_s: float | None = None) -> None:
        self.workload, self.launch_command = workload, launch_command
        self.extra_knobs = extra_knobs or {}
        self.startup_timeout_s = startup_timeout_s
        self.trial_timeout_s = trial_timeout_s

    def _server(self, knobs: dict[str, Any], trial_dir: Path) -> Any:
        from sweep.run.launcher import ServerProcess, builtin_command, free_port

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
        from sweep.run.launcher import ServerStartError

        trial_dir.mkdir(parents=True, exist_ok=True)
        server = self._server(knobs, trial_dir)
        with TrialTimeout(server, self.trial_timeout_s) as timeout, contextlib.ExitStack() as sweepers:
            spawned_at = time.monotonic()
            try:
                server.spawn()
            except OSError as err:
                raise Infeasible(f"engine failed to start: {shlex.join(server.command)}: {err}") from err
            try:
                assert server.process is not None
                pid = server.process.pid
                write_atomic(trial_dir / ENGINE_PID, json.dumps({"pid": pid, "start": process_start(pid)}))
                try:
                    server.wait_healthy()
                except ServerStartError as err:
                    timeout.check()
                    raise Infeasible(f"engine failed to start: {err}", cause=_exit_cause(server, "start"),
                                     engine_error=log_error_line(server.log_path)) from err
                write_atomic(trial_dir / ENGINE_START, json.dumps({"startup_s": time.monotonic() - spawned_at}))
                yield lambda repeat: self._measure(sweepers, server, timeout, knobs, trial_dir / f"repeat{repeat}")
            finally:
                sweepers.close()
                server.stop()
                (trial_dir / ENGINE_PID).unlink(missing_ok=True)

    def _measure(self, sweepers: contextlib.ExitStack, server: Any, timeout: TrialTimeout, knobs: dict[str, Any],
                 run_dir: Path) -> MeasurePoint:
        """A sweep run directory against the trial's engine; `measure(load)` runs one point of it."""
        from rich.console import Console

        from sweep.run.cost import occupied_devices
        from sweep.run.sweeper import Sweeper

        w = self.workload
        all_knobs = {**self.extra_knobs, **knobs}
        config = w.sweep_config(
            run_dir, server.url, all_knobs, launch_template=self.launch_command, command=shlex.join(server.command),
            devices_used=occupied_devices(all_knobs) if w.cost_per_hour is not None else None,
        )
        # The tuner's own progress owns the terminal: the sweep's per-point bars and rows stay quiet.
        try:
            sweeper = sweepers.enter_context(Sweeper(config, console=Console(stderr=True, quiet=True)))
        except TargetUnhealthy as err:  # e.g. the engine died right after /health: the configuration's failure
            self._unhealthy(server, timeout, err)
        except RuntimeError:
            timeout.check()
            self._check_alive(server)
            raise
        assert sweeper.writer is not None
        sweeper.writer.config["target"]["backend"] = "openai" if self.launch_command else "servelab"
        sweeper.writer.save_config()

        def measure(load: float) -> dict[str, Any]:
            config.num_prompts = w.prompts_for(load)
            try:
                point = sweeper.measure(load)
            except TargetUnhealthy as err:  # the point is written, with its failed requests
                self._unhealthy(server, timeout, err)
            timeout.check()
            self._check_alive(server)
            return point

        return measure

    def _unhealthy(self, server: Any, timeout: TrialTimeout, err: TargetUnhealthy) -> NoReturn:
        """Why the target stopped answering, as `Infeasible`: the trial timeout, an exit, or a hung engine."""
        timeout.check()
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.process.wait(timeout=EXIT_WAIT_S)  # a crashing engine may close its sockets before it exits
        self._check_alive(server)
        raise Infeasible(f"the engine stopped answering while measured: {err}; log {server.log_path}:\n"
                         f"{server.log_tail()}", cause="unhealthy") from err

    @staticmethod
    def _check_alive(server: Any) -> None:
        if server.process is not None and (code := server.process.poll()) is not None:
            cause = _exit_cause(server, "crash")
            what = {"oom": "ran out of memory", "crash": "crashed"}[cause]
            raise Infeasible(f"engine {what} (exit code {code}) while measured; log {server.log_path}:\n"
                             f"{server.log_tail()}", cause=cause, engine_error=log_error_line(server.log_path))
        if server.process is not None and engine_dead_behind_server(server.host, server.port):
            raise Infeasible(f"the engine behind the server died while measured (/health answers 503, e.g. a "
                             f"tensor-parallel rank died); log {server.log_path}:\n{server.log_tail()}",
                             cause="crash", engine_error=log_error_line(server.log_path))


EXIT_WAIT_S = 5.0
OOM_MARKERS = ("out of memory", "outofmemory")


def _exit_cause(server: Any, otherwise: str) -> str:
    """`oom` when the engine's log says so or the kernel killed it (SIGKILL, as its OOM killer does), else
    `otherwise`."""
    code = server.process.poll() if server.process is not None else None
    if code == -signal.SIGKILL or any(marker in server.log_tail().lower() for marker in OOM_MARKERS):
        return "oom"
    return otherwise
