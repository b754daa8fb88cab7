"""`bench tune` takes `bench sweep`'s load shapes: sessions (--turns, --conversations), rate curves, structured
outputs and --duration reach every trial's sweep (its config.json and the requests the engine saw: the mock, served
in this process); a shape that does not fit the objective or --simulate-first is a usage error before any trial;
sessions' histories feed the max_model_len floor."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import optuna
import pytest
import typer
from typer.testing import CliRunner

from engine.tokenizer import get_tokenizer
from sweep.mock.server import MockConfig, MockServer
from sweep.tune.backend import EngineBackend
from sweep.tune.commands import tune
from sweep.tune.space import DeviceInfo
from workloads.synthesis import chat_prompt_len

TOKENIZER = "tiny-random"
PINNED = {"max_num_batched_tokens": None, "enable_chunked_prefill": None, "enable_prefix_caching": None,
          "block_size": None, "tensor_parallel_size": None, "speculative_config": None, "max_num_seqs": 2}


class RecordingMock(MockServer):
    """The mock engine, keeping every generation request's body."""

    def __init__(self, config: MockConfig) -> None:
        super().__init__(config)
        self.bodies: list[dict[str, Any]] = []

    async def generate(self, conn: Any, body: bytes, arrival: float, chat: bool) -> None:
        self.bodies.append(json.loads(body))
        await super().generate(conn, body, arrival, chat)


class _Running:
    """The in-process engine's stand-in for its Popen: this process, alive."""

    pid = os.getpid()

    def poll(self) -> None:
        return None

    def wait(self, timeout: float | None = None) -> None:
        raise subprocess.TimeoutExpired("in-process mock", timeout or 0)


class InProcessEngine:
    """Stands in for a trial's ServerProcess: the recording mock on its own event loop in a thread."""

    started: list[InProcessEngine] = []

    def __init__(self, knobs: dict[str, Any], trial_dir: Path) -> None:
        self.knobs, self.host, self.port = knobs, "127.0.0.1", 0
        self.command, self.log_path = ["in-process-mock"], trial_dir / "server.log"
        self.mock = RecordingMock(MockConfig(ttft_ms=1, itl_ms=0.5))
        self.loop = asyncio.new_event_loop()
        self.process: _Running | None = None
        InProcessEngine.started.append(self)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def spawn(self) -> InProcessEngine:
        self.server = self.loop.run_until_complete(self.loop.create_server(self.mock.protocol, self.host, 0))
        self.port = self.server.sockets[0].getsockname()[1]
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.process = _Running()
        return self

    def wait_healthy(self) -> None:
        pass

    def log_tail(self, lines: int = 20) -> str:
        return ""

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.server.close()
        self.loop.close()


def run_tune(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *flags: str, space: dict[str, Any] | None = None,
             objective: str = "goodput") -> Any:
    """One trial of `bench tune` (the tuner's own EngineBackend and sweep) against the in-process mock."""
    InProcessEngine.started.clear()
    monkeypatch.setattr(EngineBackend, "_server", lambda self, knobs, trial_dir: InProcessEngine(knobs, trial_dir))
    monkeypatch.setattr(DeviceInfo, "detect", classmethod(lambda cls, **known: cls(device="cpu", **known)))
    monkeypatch.setattr("sweep.tune.commands._model_tensor_parallel_sizes", lambda model: None)
    monkeypatch.setattr("sweep.tune.report.plots", lambda study: "")
    (tmp_path / "space.json").write_text(json.dumps(space or {**PINNED, "max_model_len": {"choices": [4096]}}))
    app = typer.Typer()
    app.command()(tune)
    return CliRunner().invoke(app, [
        "--model", "mock", "--tokenizer", TOKENIZER, "--slo", "ttft=5000", "--objective", objective, "--grid",
        "--space", str(tmp_path / "space.json"), "--output-dir", str(tmp_path / "study"), "--num-warmups", "0",
        "--trial-timeout", "0", "--n-trials", "1", "--launch-command", "engine --port {port} {knob_flags}", *flags,
    ], env={"COLUMNS": "250"})  # fmt: skip


def trial_config(tmp_path: Path, trial: int = 0) -> dict[str, Any]:
    return json.loads((tmp_path / "study" / "trials" / f"trial_{trial:04d}" / "repeat0" / "config.json").read_text())


def seen(engine: InProcessEngine) -> list[dict[str, Any]]:
    return engine.mock.bodies


def test_synthetic_sessions_reach_the_trial_s_sweep_and_floor_the_context_at_a_whole_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # one request is 40 + 8 tokens; a session of three, its last turn carrying two prompts and replies, about 144
    space = {**PINNED, "max_model_len": {"choices": [64, 1024]}}
    done = run_tune(tmp_path, monkeypatch, "--endpoint", "chat", "--turns", "3", "--think-time", "0.01",
                    "--workload", "fixed", "--input-len", "40", "--output-len", "8", "--concurrency", "2",
                    "--num-prompts", "6", space=space)  # fmt: skip
    assert done.exit_code == 0, done.output
    config = trial_config(tmp_path)
    assert (config["sweep"]["turns"], config["sweep"]["think_time_s"]) == (3, 0.01)
    (engine,) = InProcessEngine.started
    bodies = seen(engine)
    assert len(bodies) == 6 and all("messages" in b for b in bodies)  # two sessions of three chat turns
    roles = sorted(tuple(m["role"] for m in b["messages"] if m["role"] != "system") for b in bodies)
    assert roles.count(("user",)) == 2 and roles.count(("user", "assistant", "user", "assistant", "user")) == 2
    assert "max_model_len: excluded [64]" in " ".join(done.output.split()) and engine.knobs["max_model_len"] == 1024
    tokenizer = get_tokenizer(TOKENIZER)
    assert max(chat_prompt_len(tokenizer, b["messages"]) + b["max_completion_tokens"] for b in bodies) > 64


def conversation_file(tmp_path: Path) -> Path:
    """Two conversations; the second's last turn carries a long recorded history."""
    long_reply = " ".join(f"word{i}" for i in range(300))
    rows = [
        {"conversations": [{"from": "human", "value": "hi there"}, {"from": "gpt", "value": "hello back"}]},
        {"conversations": [{"from": "human", "value": "tell me a story"}, {"from": "gpt", "value": long_reply},
                           {"from": "human", "value": "and the end?"}, {"from": "gpt", "value": "they lived"}]},
    ]
    path = tmp_path / "chats.json"
    path.write_text(json.dumps(rows))
    return path


def test_real_conversations_reach_the_trial_s_sweep_and_their_histories_floor_the_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The longest request of a session study is its last turn, history and all: a context below it is left out of
    the space, and the longest request the engine saw fits the floor."""
    path = conversation_file(tmp_path)
    tokenizer = get_tokenizer(TOKENIZER)
    story = json.loads(path.read_text())[1]["conversations"]
    messages = [{"role": "user" if m["from"] == "human" else "assistant", "content": m["value"]} for m in story]
    last_turn = chat_prompt_len(tokenizer, messages[:3]) + len(tokenizer.encode("they lived",
                                                                               add_special_tokens=False))
    assert last_turn > 320  # above what the default random workload's 256 + 64 tokens would have floored
    short, long = last_turn - 1, last_turn + 200
    space = {**PINNED, "max_model_len": {"choices": [short, long]}}
    done = run_tune(tmp_path, monkeypatch, "--endpoint", "chat", "--conversations", str(path), "--concurrency", "1",
                    "--num-prompts", "3", space=space)  # fmt: skip
    assert done.exit_code == 0, done.output
    assert trial_config(tmp_path)["workload"]["conversations"] == str(path)
    assert f"max_model_len: excluded [{short}]" in " ".join(done.output.split())
    (engine,) = InProcessEngine.started
    histories = [[m["content"] for m in b["messages"] if m["role"] == "assistant"] for b in seen(engine)]
    assert any(h and h[0].startswith("word0 word1") for h in histories)  # a turn carrying the recorded reply
    assert engine.knobs["max_model_len"] == long
    db = f"sqlite:///{tmp_path / 'study' / 'tune.db'}"
    (name,) = optuna.get_all_study_names(db)
    floor = optuna.load_study(study_name=name, storage=db).user_attrs["longest_request"]
    sent = [chat_prompt_len(tokenizer, b["messages"]) + b["max_completion_tokens"] for b in seen(engine)]
    assert short < max(sent) <= floor < long


def test_a_rate_curve_reaches_the_trial_s_sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    done = run_tune(tmp_path, monkeypatch, "--request-rate", "40", "--rate-curve", "1,4,2", "--workload", "fixed",
                    "--input-len", "8", "--output-len", "2", "--num-prompts", "12")  # fmt: skip
    assert done.exit_code == 0, done.output
    config = trial_config(tmp_path)
    assert config["sweep"]["rate_curve"] == [1.0, 4.0, 2.0] and config["sweep"]["mode"] == "rate"
    assert len(seen(InProcessEngine.started[0])) == 12


def test_structured_outputs_reach_the_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    done = run_tune(tmp_path, monkeypatch, "--structured-output", "choice", "--workload", "fixed", "--input-len", "8",
                    "--output-len", "16", "--concurrency", "2", "--num-prompts", "4")  # fmt: skip
    assert done.exit_code == 0, done.output
    assert trial_config(tmp_path)["workload"]["structured_output"] == "choice"
    bodies = seen(InProcessEngine.started[0])
    assert len(bodies) == 4 and all("choice" in b.get("structured_outputs", {}) for b in bodies)


def test_a_duration_reaches_the_trial_s_sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    done = run_tune(tmp_path, monkeypatch, "--duration", "0.4", "--request-rate", "20", "--workload", "fixed",
                    "--input-len", "8", "--output-len", "2")  # fmt: skip
    assert done.exit_code == 0, done.output
    config = trial_config(tmp_path)
    assert config["sweep"]["duration"] == 0.4 and config["sweep"]["num_prompts"] is None
    assert 0 < len(seen(InProcessEngine.started[0])) <= 8  # rate x duration: the duration pool, not 32 prompts


REFUSALS = [
    (("--replay", "--workload", "azure-code-2023"), "max-load", "--replay sends the trace at its own timestamps, "
     "so --objective max-load has no load to search"),
    (("--replay", "--workload", "azure-code-2023", "--concurrency", "2"), "goodput", "drop --concurrency"),
    (("--replay", "--workload", "azure-code-2023", "--time-scale", "1,2"), "goodput", "--time-scale takes one number"),
    (("--replay", "--workload", "random"), "goodput", "--replay needs a workload with timestamps"),
    (("--time-scale", "2", "--concurrency", "2"), "goodput", "--time-scale sets a --replay's speed"),
    (("--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "4"), "max-load",
     "--ramp-up-strategy is one point whose rate ramps"),
    (("--ramp-up-strategy", "linear", "--ramp-up-end-rps", "4"), "goodput", "needs --ramp-up-start-rps"),
    (("--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "4", "--request-rate", "2"),
     "goodput", "--ramp-up-strategy replaces --request-rate"),
    (("--ramp-up-strategy", "steep", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "4"), "goodput",
     "ramp-up needs a strategy in"),
    (("--rate-curve", "1,4,2", "--concurrency", "2"), "goodput", "--rate-curve shapes --request-rate points"),
    (("--rate-curve", "1,x", "--request-rate", "2"), "goodput", "--rate-curve takes comma-separated"),
    (("--turns", "2", "--concurrency", "2"), "goodput", "--turns needs --endpoint chat"),
    (("--turns", "0", "--endpoint", "chat", "--concurrency", "2"), "goodput", "--turns must be >= 1"),
    (("--conversations", "missing.json", "--endpoint", "chat"), "goodput", "no such conversation file"),
    (("--structured-output", "yaml"), "goodput", "--structured-output must be one of"),
    (("--structured-output", "json", "--structured-output-shape", "xml"), "goodput",
     "--structured-output-shape must be one of"),
    (("--duration", "0"), "goodput", "duration must be > 0"),
]


@pytest.mark.parametrize(("flags", "objective", "message"), REFUSALS, ids=[" ".join(r[0][:2]) for r in REFUSALS])
def test_a_shape_that_cannot_run_is_a_usage_error_before_any_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: tuple[str, ...], objective: str, message: str
) -> None:
    done = run_tune(tmp_path, monkeypatch, *flags, objective=objective)
    assert done.exit_code == 2, done.output
    assert message in " ".join(done.output.split())
    assert not InProcessEngine.started and not (tmp_path / "study").exists()


@pytest.mark.parametrize("flags", [("--turns", "2", "--endpoint", "chat", "--concurrency", "2"),
                                   ("--rate-curve", "1,2", "--request-rate", "2"),
                                   ("--structured-output", "json", "--request-rate", "2"),
                                   ("--replay", "--workload", "azure-code-2023")])
def test_simulate_first_refuses_the_shapes_the_simulator_cannot_model(tmp_path: Path, flags: tuple[str, ...]) -> None:
    app = typer.Typer()
    app.command()(tune)
    done = CliRunner().invoke(app, ["--model", "tiny-random", "--slo", "ttft=500", "--objective", "goodput",
                                    "--simulate-first", str(tmp_path / "profile.json"),
                                    "--output-dir", str(tmp_path / "study"), *flags], env={"COLUMNS": "250"})
    assert done.exit_code == 2, done.output
    said = " ".join(done.output.split())
    assert "--simulate-first: the simulator models closed and open loops of single requests" in said
    assert flags[0] in said.split("not ", 1)[1] and not (tmp_path / "study").exists()


def test_a_replay_and_a_ramp_reach_the_trial_s_sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = tmp_path / "trace.jsonl"
    rows = [{"timestamp": 0.05 * i, "input_len": 8 + i, "output_len": 2} for i in range(10)]
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    done = run_tune(tmp_path, monkeypatch, "--replay", "--workload", str(trace), "--time-scale", "0.5",
                    "--num-prompts", "6")  # fmt: skip
    assert done.exit_code == 0, done.output
    config = trial_config(tmp_path)
    assert (config["sweep"]["mode"], config["sweep"]["num_prompts"]) == ("replay", 6)
    assert (tmp_path / "study" / "trials" / "trial_0000" / "repeat0" / "points" / "t000.500.json").exists()
    assert len(seen(InProcessEngine.started[0])) == 6  # the trace's first six rows, at their timestamps

    ramp = tmp_path / "ramp"
    ramp.mkdir()
    done = run_tune(ramp, monkeypatch, "--ramp-up-strategy", "linear", "--ramp-up-start-rps", "10",
                    "--ramp-up-end-rps", "40", "--workload", "fixed", "--input-len", "8", "--output-len", "2",
                    "--num-prompts", "8")  # fmt: skip
    assert done.exit_code == 0, done.output
    assert trial_config(ramp)["sweep"]["ramp_up"] == ["linear", 10.0, 40.0]
    assert len(seen(InProcessEngine.started[0])) == 8


def test_tune_and_sweep_declare_the_shape_flags_once() -> None:
    """The same flags, defaults and help in both commands (tune's own help only where its meaning differs)."""
    import typer.main

    import sweep.commands  # noqa: F401 - registers bench sweep
    from cli import app
    from sweep.cli_options import SHAPE_OPTION_TYPES, SHARED_OPTIONS

    group = typer.main.get_command(app)
    commands = {name: group.commands[name] for name in ("sweep", "tune")}  # type: ignore[attr-defined]
    for name in SHAPE_OPTION_TYPES:
        options = {cmd: next(p for p in command.params if p.name == name) for cmd, command in commands.items()}
        assert options["sweep"].opts == options["tune"].opts
        assert options["sweep"].default == options["tune"].default == SHARED_OPTIONS[name].default
        assert options["sweep"].help == SHARED_OPTIONS[name].help
        if name not in ("replay", "time_scale", "ramp_up_strategy", "rate_curve"):
            assert options["tune"].help == SHARED_OPTIONS[name].help, name
    assert next(p for p in commands["tune"].params if p.name == "duration").help == SHARED_OPTIONS["duration"].help


def test_prompt_counts_with_sessions_and_durations() -> None:
    from sweep.tune.workload_lengths import prompt_counts

    assert prompt_counts(4, "concurrency", 1, 3, turns=3) == [4, 6, 9]  # a session's turns per stream
    assert prompt_counts(None, "rate", 1, 2, duration=2.0) == [2, 3, 4]  # rate x duration, every rate between
    assert prompt_counts(None, "rate", 2, 2, duration=2.0, turns=2) == [8]  # turns per pooled session
    assert prompt_counts(None, "concurrency", 1, 20, duration=5.0) == [200, 220, 240, 260, 280, 300, 320, 340, 360,
                                                                       380, 400]  # the closed loop's duration pool
    assert prompt_counts(6, "replay", 1, 1) == [6] and prompt_counts(None, "replay", 1, 1, duration=1.0) == []
