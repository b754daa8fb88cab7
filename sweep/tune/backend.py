"""A trial's engine and its load points: the sweep's launcher, runner, metrics and run-dir writer, per trial.

Each trial starts its engine once (the built-in `bench serve` or an external launch template), then each repeat
writes one sweep run directory `trial_NNNN/repeatR/` (the results contract: config.json, points/, requests.jsonl,
summary.csv) plus the engine's `server.log` in the trial directory. A start failure, or an engine that dies while
it is measured, raises `Infeasible` with the log's tail. The engine's pid is written to `engine.pid`, so a later
worker can end an engine whose tuner was killed (`reap_orphan_engine`).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shlex
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
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
    input_len: int | None = 256
    output_len: int | None = 64
    num_prompts: int = 32
    num_warmups: int = 1
    endpoint: str = "completions"
    seed: int = 0
    tokenizer: str | None = None
    slo: dict[str, float] = field(default_factory=dict)  # {"ttft_ms": .., "tpot_ms": ..}
    percentiles: tuple[float, ...] = (50.0, 90.0, 99.0)
    load_mode: str = "concurrency"
    burstiness: float = 1.0


def process_start(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


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
        from sweep.metrics import SLO_KEYS  # noqa: F401  (fails early if the sweep package is incomplete)

        self.workload, self.launch_command = workload, launch_command
        self.extra_knobs = extra_knobs or {}
        self.startup_timeout_s = startup_timeout_s
        self._tokenizer: Any = None

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from engine.tokenizer import get_tokenizer

            self._tokenizer = get_tokenizer(self.workload.tokenizer or self.workload.model)
        return self._tokenizer

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
        try:
            yield lambda repeat: self._measure(server, knobs, trial_dir / f"repeat{repeat}")
        finally:
            server.stop()
            (trial_dir / ENGINE_PID).unlink(missing_ok=True)

    def _run_config(self, server: Any, knobs: dict[str, Any], run_dir: Path) -> dict[str, Any]:
        import optuna

        w = self.workload
        return {
            "run_id": f"{run_dir.parent.name}-{run_dir.name}-{uuid.uuid4().hex[:8]}",
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "target": {"url": server.url, "model": w.model, "backend": "openai" if self.launch_command else "servelab",
                       "engine_knobs": {**self.extra_knobs, **knobs}},
            "workload": {k: v for k, v in asdict(w).items() if k not in ("slo", "percentiles", "model", "load_mode")},
            "sweep": {"mode": w.load_mode, "values": [], "num_prompts": w.num_prompts, "duration": None,
                      "burstiness": w.burstiness, "num_warmups": w.num_warmups},
            "slo": w.slo or None,
            "percentiles": list(w.percentiles),
            "versions": {"python": platform.python_version(), "optuna": optuna.__version__},
            "machine": {"hostname": platform.node(), "cpus": os.cpu_count(), "platform": platform.platform()},
            "command": shlex.join(server.command),
        }

    def _measure(self, server: Any, knobs: dict[str, Any], run_dir: Path) -> MeasurePoint:
        from sweep.client import ClientConfig
        from sweep.metrics import calculate_metrics
        from sweep.results import concurrency_label, open_run, rate_label
        from sweep.runner import PointSpec, WorkloadConfig, run_point

        w = self.workload
        config = self._run_config(server, knobs, run_dir)
        writer = open_run(run_dir, config, resume=True)
        client = ClientConfig(url=server.url, model=w.model, endpoint=w.endpoint)
        workload = WorkloadConfig(workload=w.workload, input_len=w.input_len, output_len=w.output_len, seed=w.seed,
                                  endpoint=w.endpoint, max_model_len=knobs.get("max_model_len"))

        def measure(load: float) -> dict[str, Any]:
            concurrency = w.load_mode == "concurrency"
            label = concurrency_label(int(load)) if concurrency else rate_label(float(load))
            if label in writer.finished_labels():
                return writer.load_point(label)
            spec = PointSpec(label=label, mode=w.load_mode, concurrency=int(load) if concurrency else None,
                             rate=float(load) if not concurrency else float("inf"), burstiness=w.burstiness,
                             num_prompts=max(w.num_prompts, int(load) if concurrency else 1),
                             num_warmups=w.num_warmups)
            run = run_point(client, spec, workload, self.tokenizer, salt=config["run_id"])
            self._check_alive(server)
            point = {"label": label, **calculate_metrics(run.records, run.duration, w.percentiles, w.slo or None),
                     "max_concurrency": int(load) if concurrency else None,
                     "request_rate": "inf" if concurrency else float(load), "burstiness": w.burstiness}
            writer.write_point(point, [r.to_row(label) for r in run.records])
            config["sweep"]["values"].append(load)
            return point

        return measure

    @staticmethod
    def _check_alive(server: Any) -> None:
        if server.process is not None and (code := server.process.poll()) is not None:
            tail = server.log_tail()
            oom = "out of memory" in tail.lower() or "outofmemory" in tail.lower()
            raise Infeasible(f"engine {'ran out of memory' if oom else 'crashed'} (exit code {code}) "
                             f"while measured; log {server.log_path}:\n{tail}")
