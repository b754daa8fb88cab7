"""`bench tune --engine vllm`: the preset writes the `vllm serve` template, knobs vLLM lacks are refused by name
before any trial, a configuration vLLM refuses is infeasible with vLLM's own error line, no engine process outlives
the study, and the best configuration comes out as a runnable `vllm serve` command.

The fast end-to-end test launches a fake `vllm` (written here) that parses vLLM's flags, refuses a max_model_len
above 2048 the way vLLM does, and otherwise serves the mock from a child process. The slow one runs real vLLM.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
import typer
from typer.testing import CliRunner

from sweep.run.launcher import ServerProcess
from sweep.tune import engines
from sweep.tune.commands import tune
from sweep.tune.space import DeviceInfo, build_space
from tests.sweep.fake_vllm_helpers import FAKE_MAX_LEN, fake_vllm
from tests.sweep.real_vllm_helpers import VLLM, VLLM_CPU_ENV, VLLM_MODEL, requires_real_vllm


def app() -> typer.Typer:
    application = typer.Typer()
    application.command()(tune)
    return application


def quiet_tuner(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither the machine, the model's config nor the plots matter here (reading them imports torch and
    matplotlib)."""
    monkeypatch.setattr(DeviceInfo, "detect", classmethod(lambda cls, **known: cls(device="cpu", **known)))
    monkeypatch.setattr("sweep.tune.commands._model_tensor_parallel_sizes", lambda model: None)
    monkeypatch.setattr("sweep.tune.commands._model_max_len", lambda model: None)
    monkeypatch.setattr("sweep.tune.report.plots", lambda study: "")


ONLY_SEQS_AND_LEN = {"block_size": None, "enable_chunked_prefill": None, "max_num_batched_tokens": None,
                     "tensor_parallel_size": None, "gpu_memory_utilization": None}  # fmt: skip


def run_tune(tmp_path: Path, space: dict[str, Any], *flags: str, model: str | None = None) -> Any:
    (tmp_path / "space.json").write_text(json.dumps(space))
    return CliRunner().invoke(app(), [
        "--model", model or str(tmp_path), "--tokenizer", "tiny-random", "--workload", "fixed", "--input-len", "8",
        "--output-len", "8", "--num-prompts", "4", "--num-warmups", "0", "--slo", "ttft=5000", "--objective",
        "goodput", "--concurrency", "2", "--grid", "--space", str(tmp_path / "space.json"), "--output-dir",
        str(tmp_path / "study"), "--startup-timeout", "30", *flags,
    ], env={"COLUMNS": "2000"})  # fmt: skip


def gone(pid: int) -> bool:
    """The process is gone (or a zombie waiting for a reaper that is not ours)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.slow  # about 8 s: two trials, each a process tree and its sweep
def test_a_vllm_study_spells_vllm_flags_records_vllm_s_refusal_and_prints_vllm_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    quiet_tuner(monkeypatch)
    executable, calls, pids = fake_vllm(tmp_path)
    model_dir = tmp_path / "model-hf"
    model_dir.mkdir()
    space = {**ONLY_SEQS_AND_LEN, "max_num_seqs": {"fixed": 2}, "enable_prefix_caching": {"fixed": False},
             "max_model_len": {"choices": [1024, 4096]}, "speculative_config.num_speculative_tokens": {"fixed": 3},
             "speculative_config.prompt_lookup_max": {"fixed": 4}}  # fmt: skip
    done = run_tune(tmp_path, space, "--engine", "vllm", "--vllm-command", str(executable), model=str(model_dir))
    assert done.exit_code == 0, done.output

    launched = [json.loads(line) for line in calls.read_text().splitlines()]
    assert sorted(call["max_model_len"] for call in launched) == [1024, 4096]
    for call in launched:  # every knob as vLLM spells it; the served name is the model the client sends
        assert call["command"] == "serve" and call["model"] == str(model_dir) == call["served_model_name"]
        assert call["host"] == "127.0.0.1" and call["max_num_seqs"] == 2 and call["enable_prefix_caching"] is False
        assert call["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}

    url = f"sqlite:///{tmp_path / 'study' / 'tune.db'}"
    (name,) = optuna.get_all_study_names(url)
    study = optuna.load_study(study_name=name, storage=url)
    assert study.user_attrs["engine"] == "vllm"
    by_len = {t.user_attrs["knobs"]["max_model_len"]: t for t in study.trials}
    refused, served = by_len[4096], by_len[1024]
    vllm_said = ("ValueError: User-specified max_model_len (4096) is greater than the derived max_model_len "
                 f"(max_position_embeddings={FAKE_MAX_LEN})")
    assert refused.user_attrs["status"] == "infeasible" and refused.user_attrs["cause"] == "start"
    assert refused.user_attrs["engine_error"] == vllm_said
    assert refused.user_attrs["error"].splitlines()[0] == vllm_said
    assert served.user_attrs["status"] == "ok" and served.values[0] > 0
    assert served.user_attrs["startup_s"] > 0 and "startup_s" not in refused.user_attrs  # the start, apart

    child_pids = [int(p.name) for p in pids.iterdir()]
    assert len(child_pids) == 1  # the refused configuration never got to serve
    deadline = time.monotonic() + 5
    while not all(gone(pid) for pid in child_pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(gone(pid) for pid in child_pids), "the fake vllm's server child outlived the study"

    (best,) = json.loads((tmp_path / "study" / "best.json").read_text())
    command = shlex.split(best["launch_command"])
    assert command[:3] == [str(executable), "serve", str(model_dir)]
    assert " ".join(command[3:]).startswith(f"--host 127.0.0.1 --port 8000 --served-model-name {model_dir}")
    assert "--max-model-len 1024" in best["launch_command"] and "--no-enable-prefix-caching" in best["launch_command"]
    said = " ".join(done.output.split())
    assert f": {best['launch_command']}" in said and "bench serve" not in said  # printed as the runnable command


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--engine", "vllm", "--launch-command", "x --port {port}"], "give --engine"),
        (["--engine", "vllm", "--max-quality-loss", "2%"], "--max-quality-loss measures the built-in engine"),
        (["--engine", "vllm", "--simulate-first", "p.json"], "--simulate-first measures the built-in engine"),
        (["--launch-command", "x --port {port}", "--simulate-first", "p.json", "--max-quality-loss", "2%"],
         "--max-quality-loss and --simulate-first measure the built-in engine"),
        (["--vllm-command", "vllm"], "--vllm-command and --vllm-args are for --engine vllm"),
        (["--engine", "sglang"], "--engine must be one of servelab, vllm"),
    ],
)
def test_engine_options_that_cannot_work_are_usage_errors_before_any_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str], message: str
) -> None:
    quiet_tuner(monkeypatch)
    executable, calls, _ = fake_vllm(tmp_path)
    if "--engine" in flags and "vllm" in flags and "--vllm-command" not in flags:
        flags = [*flags, "--vllm-command", str(executable)]
    done = run_tune(tmp_path, ONLY_SEQS_AND_LEN, *flags)
    assert done.exit_code == 2, done.output
    assert message in " ".join(done.output.split())
    assert not calls.exists() and not (tmp_path / "study").exists()


def test_knobs_only_our_engine_has_are_refused_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    quiet_tuner(monkeypatch)
    executable, calls, _ = fake_vllm(tmp_path)
    space = {**ONLY_SEQS_AND_LEN, "cpu_threads": {"fixed": 2}, "quantization": {"choices": ["none", "int4"]},
             "inject_step_delay_ms": {"fixed": 5.0}}  # fmt: skip
    done = run_tune(tmp_path, space, "--engine", "vllm", "--vllm-command", str(executable))
    assert done.exit_code == 2, done.output
    said = " ".join(done.output.split())
    assert "--engine vllm does not take these knobs of the search space" in said
    for name in ("cpu_threads (", "quantization (", "inject_step_delay_ms ("):
        assert name in said
    assert "VLLM_CPU_OMP_THREADS_BIND" in said  # where vLLM's thread binding is set instead
    assert not calls.exists()


def test_our_model_aliases_are_not_what_vllm_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    quiet_tuner(monkeypatch)
    executable, _, _ = fake_vllm(tmp_path)
    done = run_tune(tmp_path, ONLY_SEQS_AND_LEN, "--engine", "vllm", "--vllm-command", str(executable),
                    model="smollm2-135m")
    assert done.exit_code == 2, done.output
    assert "bench model export-hf smollm2-135m" in " ".join(done.output.split())
    assert engines.check_vllm_model("HuggingFaceTB/SmolLM2-135M") == "HuggingFaceTB/SmolLM2-135M"  # a hub id


@pytest.mark.parametrize("device", [DeviceInfo(), DeviceInfo(device="cuda", num_devices=8, model_max_len=8192)])
def test_the_default_space_is_made_of_vllm_knobs_only(device: DeviceInfo) -> None:
    names = set(build_space(device).placeholder_knobs())
    assert {"max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching", "speculative_config"} <= names
    assert names <= set(engines.VLLM_KNOBS) and engines.refused_knobs("vllm", names) == []
    assert engines.refused_knobs("servelab", ["cpu_threads"]) == []


def test_the_vllm_executable_defaults_to_the_make_vllm_venv_then_path(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    venv_vllm = tmp_path / ".venv-vllm" / "bin" / "vllm"
    monkeypatch.setattr(engines, "VLLM_VENV_COMMAND", venv_vllm)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="run `make vllm` or give --vllm-command"):
        engines.vllm_command(None)
    venv_vllm.parent.mkdir(parents=True)
    venv_vllm.write_text("#!/bin/sh\n")
    venv_vllm.chmod(0o755)
    assert engines.vllm_command(None) == str(venv_vllm)
    with pytest.raises(ValueError, match="--vllm-command /nowhere/vllm: no such executable"):
        engines.vllm_command("/nowhere/vllm")
    template = engines.preset("vllm").launch_command
    assert template == (f"{venv_vllm} serve {{model}} --host {{host}} --port {{port}} --served-model-name {{model}} "
                        "{knob_flags}")


PYDANTIC_LOG = """\
(APIServer pid=7) Traceback (most recent call last):
(APIServer pid=7)   File "vllm/engine/arg_utils.py", line 1, in create_model_config
(APIServer pid=7) pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig
(APIServer pid=7)   Value error, prompt_lookup_min=4 must be <= prompt_lookup_max=2 [type=value_error, input_value=\
ArgsKwargs((), {'method': 'ngram'}), input_type=ArgsKwargs]
(APIServer pid=7)     For further information visit https://errors.pydantic.dev/2.11/v/value_error
"""
WRAPPED_LOG = """\
(EngineCore_DP0 pid=9) ERROR 12-02 10:00:00 [core.py:708] torch.OutOfMemoryError: out of memory allocating KV
(APIServer pid=8) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


def test_the_engine_error_line_is_vllm_s_own() -> None:
    assert engines.engine_error_line(PYDANTIC_LOG) == (
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig Value error, "
        "prompt_lookup_min=4 must be <= prompt_lookup_max=2"
    )
    assert engines.engine_error_line(WRAPPED_LOG) == "torch.OutOfMemoryError: out of memory allocating KV"
    assert engines.engine_error_line("INFO serving\nshutting down\n") is None


@requires_real_vllm
def test_a_two_trial_study_on_real_vllm_with_one_refused_configuration(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Real `vllm serve` (about a minute a start on two cores with --enforce-eager, which skips torch.compile;
    minutes without): one configuration serves, one with a draft model
    vLLM cannot load is refused with vLLM's own exception line, and no vLLM process outlives the study."""
    for name, value in VLLM_CPU_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("sweep.tune.report.plots", lambda study: "")
    groups: list[int] = []  # each engine's process group (the launcher starts it in a session of its own)
    spawn = ServerProcess.spawn

    def recorded_spawn(self: ServerProcess) -> ServerProcess:
        spawned = spawn(self)
        groups.append(spawned.process.pid)  # type: ignore[union-attr]
        return spawned

    monkeypatch.setattr(ServerProcess, "spawn", recorded_spawn)
    refused = json.dumps({"method": "draft_model", "model": str(tmp_path / "no-such-draft"),
                          "num_speculative_tokens": 2})  # fmt: skip
    space = {**ONLY_SEQS_AND_LEN, "max_num_seqs": {"fixed": 4}, "enable_prefix_caching": {"fixed": True},
             "max_model_len": {"fixed": 1024}, "dtype": {"fixed": "float32"},
             "speculative_config": {"choices": [None, refused]}}  # fmt: skip
    (tmp_path / "space.json").write_text(json.dumps(space))
    done = CliRunner().invoke(app(), [
        "--engine", "vllm", "--vllm-command", str(VLLM), "--vllm-args", "--enforce-eager",
        "--model", str(VLLM_MODEL), "--workload", "fixed",
        "--input-len", "32", "--output-len", "16", "--num-prompts", "4", "--num-warmups", "1", "--slo", "ttft=60000",
        "--objective", "goodput", "--concurrency", "2", "--grid", "--space", str(tmp_path / "space.json"),
        "--output-dir", str(tmp_path / "study"), "--startup-timeout", "900", "--trial-timeout", "1500",
    ], env={"COLUMNS": "2000"})  # fmt: skip
    assert done.exit_code == 0, done.output
    url = f"sqlite:///{tmp_path / 'study' / 'tune.db'}"
    (name,) = optuna.get_all_study_names(url)
    trials = {t.user_attrs["knobs"]["speculative_config"]: t for t in optuna.load_study(study_name=name,
                                                                                         storage=url).trials}
    assert trials[None].user_attrs["status"] == "ok" and trials[None].values[0] > 0
    assert trials[None].user_attrs["startup_s"] > 0  # vLLM's start, apart from the measurement
    bad = trials[refused]
    assert bad.user_attrs["status"] == "infeasible" and bad.user_attrs["cause"] == "start"
    assert engines.engine_error_line(bad.user_attrs["engine_error"]) == bad.user_attrs["engine_error"]
    server_logs = list((tmp_path / "study" / "trials").glob("trial_*/server.log"))
    assert len(server_logs) == 2
    (best,) = json.loads((tmp_path / "study" / "best.json").read_text())
    assert shlex.split(best["launch_command"])[1:3] == ["serve", str(VLLM_MODEL.resolve())]
    assert len(groups) == 2
    deadline = time.monotonic() + 30
    while (survivors := _in_groups(groups)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not survivors, f"vLLM processes outlived the study: {survivors}"


def _in_groups(groups: list[int]) -> list[int]:
    """Live (not zombie) processes whose process group is one of `groups`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            state, _ppid, group = (proc / "stat").read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if int(group) in groups and state != "Z":
            found.append(int(proc.name))
    return found


def test_vllm_args_go_on_every_trials_command_and_never_override_a_knob(tmp_path: Path) -> None:
    template = engines.preset("vllm", sys.executable, "--enforce-eager --compilation-config '{\"level\": 0}'")
    assert template.launch_command is not None
    assert template.launch_command.endswith("{knob_flags} --enforce-eager --compilation-config '{{\"level\": 0}}'")
    command = shlex.split(template.launch_command.format(model="m", host="h", port=1, knob_flags="--max-num-seqs 2"))
    assert command[-5:] == ["--max-num-seqs", "2", "--enforce-eager", "--compilation-config", '{"level": 0}']
    with pytest.raises(ValueError, match="--max-num-seqs: a knob of the search space sets that flag"):
        engines.preset("vllm", sys.executable, "--max-num-seqs=8")
    with pytest.raises(ValueError, match="are for --engine vllm"):
        engines.preset("servelab", None, "--enforce-eager")
