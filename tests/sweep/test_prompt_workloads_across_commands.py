"""Prompt-file workloads beyond `bench sweep`'s closed and open loops: `bench simulate` measures their text's lengths,
`bench tune` sizes its context from them and runs its trials on them, `--replay` refuses them before anything runs,
`prompts:NAME` names a shipped set, and `bench workloads show --compare` takes several mixes."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from engine.tokenizer import get_tokenizer
from sweep.point.runner import WorkloadConfig
from sweep.run.results import load_results
from sweep.run.sweeper import SweepConfig
from sweep.simulate.simulation import SimulateConfig, load_profile, run_simulation
from sweep.tune.backend import TrialWorkload
from sweep.tune.space import DeviceInfo
from sweep.tune.workload_lengths import SAMPLE_SALT, longest_request
from workloads.prompt_files import prompt_file_path, read_prompt_file
from workloads.text_workloads import text_prompts

TOKENIZER = get_tokenizer("tiny-random")
CHATS = [{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Name {k} colours."}],
          "output_len": 3} for k in range(1, 5)]  # fmt: skip


def _profile(tmp_path: Path) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({
        "kind": "servelab-step-profile", "knobs": {"model": "tiny-random", "dtype": "float32"},
        "kv_cache": {"tokens": 8192}, "cost_model": {"coefficients": {"overhead": 0.01, "tokens": 0.001}},
    }))  # fmt: skip
    return path


def test_simulate_sends_the_text_s_lengths(tmp_path: Path) -> None:
    config = SimulateConfig(output_dir=tmp_path / "run", profile=load_profile(_profile(tmp_path)), values=[2],
                            engine_knobs={"max_num_seqs": 2, "max_model_len": 2048},
                            workload=WorkloadConfig(workload="servelab-prompts"), num_prompts=8)  # fmt: skip
    run = load_results(run_simulation(config))
    assert (run.points["completed"] == 8).all()
    salt = f"{run.config['workload']['salt']}-c0002"
    specs, _ = text_prompts("servelab-prompts", "completions", None, TOKENIZER, 8, 0, salt)
    assert sorted(run.requests["requested_input_len"]) == sorted(s.input_len for s in specs)
    assert sorted(run.requests["requested_output_len"]) == sorted(s.output_len for s in specs)
    assert len(set(run.requests["requested_input_len"])) > 1  # the texts' own lengths, not one synthetic length

    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps(row) + "\n" for row in CHATS))
    config = SimulateConfig(output_dir=tmp_path / "chat-run", profile=load_profile(_profile(tmp_path)), values=[1],
                            engine_knobs={"max_num_seqs": 2, "max_model_len": 512},
                            workload=WorkloadConfig(workload=f"prompts:{chats}"), num_prompts=4)  # fmt: skip
    run = load_results(run_simulation(config))  # bench simulate has no --endpoint: chats are measured as chats
    salt = f"{run.config['workload']['salt']}-c0001"
    specs, _ = text_prompts(f"prompts:{chats}", "chat", None, TOKENIZER, 4, 0, salt)
    assert sorted(run.requests["requested_input_len"]) == sorted(s.input_len for s in specs)
    assert (run.requests["output_tokens"] == 3).all()


def test_replay_refuses_prompt_text_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"--replay needs a workload with timestamps; 'servelab-prompts' is prompt"):
        SweepConfig(output_dir=tmp_path / "r", mode="replay", values=[1.0],
                    workload=WorkloadConfig(workload="servelab-prompts"))  # fmt: skip
    assert not (tmp_path / "r").exists()


def test_prompts_prefix_names_a_shipped_set_unless_a_file_has_that_name(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    assert prompt_file_path("prompts:servelab-prompts") == prompt_file_path("servelab-prompts")
    assert len(read_prompt_file("prompts:servelab-prompts").rows) == len(read_prompt_file("servelab-prompts").rows)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "servelab-prompts").write_text(json.dumps({"prompt": "a local file"}) + "\n")
    assert prompt_file_path("prompts:servelab-prompts") == Path("servelab-prompts")
    with pytest.raises(FileNotFoundError, match="no such prompt file"):
        prompt_file_path("prompts:servelab-prompt")


def test_tune_longest_request_of_a_prompt_file(tmp_path: Path) -> None:
    rows = read_prompt_file("servelab-prompts").rows
    every = text_prompts("servelab-prompts", "completions", None, TOKENIZER, None, 0, SAMPLE_SALT)[0]
    ceiling = max(s.input_len + s.output_len for s in every)
    few = text_prompts("servelab-prompts", "completions", None, TOKENIZER, 4, 0, SAMPLE_SALT)[0]
    assert longest_request("servelab-prompts", None, None, 0, [4], "tiny-random") == max(
        s.input_len + s.output_len for s in few
    )
    many = text_prompts("servelab-prompts", "completions", None, TOKENIZER, 2 * len(rows), 0, SAMPLE_SALT)[0]
    assert longest_request("servelab-prompts", None, None, 0, [4, 2 * len(rows)], "tiny-random") == max(
        s.input_len + s.output_len for s in many
    ) >= ceiling
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps(row) + "\n" for row in CHATS))
    chat_specs = text_prompts(f"prompts:{chats}", "chat", None, TOKENIZER, None, 0, SAMPLE_SALT)[0]
    assert longest_request(f"prompts:{chats}", None, None, 0, [4], "tiny-random", "chat") == max(
        s.input_len + s.output_len for s in chat_specs
    )


class _Backend:
    """Stands in for the tuner's EngineBackend: records each trial's workload; every point meets the SLO."""

    made: list[TrialWorkload] = []

    def __init__(self, workload: TrialWorkload, **_: Any) -> None:
        _Backend.made.append(workload)

    @contextlib.contextmanager
    def launch(self, knobs: dict[str, Any], trial_dir: Path) -> Iterator[Callable[[int], Any]]:
        def for_repeat(repeat: int) -> Callable[[float], dict[str, Any]]:
            def measure(load: float) -> dict[str, Any]:
                return {"label": f"c{int(load):04d}", "max_concurrency": int(load), "slo_attainment": 1.0,
                        "request_goodput": 1.0, "p90_ttft_ms": 1.0, "completed": 4}  # fmt: skip
            return measure

        yield for_repeat


def _tune(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workload: str, space: dict[str, Any]) -> Any:
    from sweep.tune.commands import tune

    _Backend.made.clear()
    tmp_path.mkdir(exist_ok=True)
    monkeypatch.setattr("sweep.tune.backend.EngineBackend", _Backend)
    monkeypatch.setattr(DeviceInfo, "detect", classmethod(lambda cls, **known: cls(device="cpu", **known)))
    monkeypatch.setattr("sweep.tune.commands._model_tensor_parallel_sizes", lambda model: None)
    monkeypatch.setattr("sweep.tune.report.plots", lambda study: "")
    (tmp_path / "space.json").write_text(json.dumps(space))
    app = typer.Typer()
    app.command()(tune)
    return CliRunner().invoke(app, [
        "--model", "mock", "--tokenizer", "tiny-random", "--slo", "ttft=500", "--objective", "goodput",
        "--concurrency", "2", "--grid", "--space", str(tmp_path / "space.json"), "--output-dir",
        str(tmp_path / "study"), "--num-prompts", "4", "--launch-command", "engine --port {port} {knob_flags}",
        "--workload", workload,
    ], env={"COLUMNS": "250"})  # fmt: skip


def test_tune_runs_on_a_prompt_file_and_sizes_its_context_from_the_text(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    longest = longest_request("servelab-prompts", None, None, 0, [4], "tiny-random")
    pinned = {"max_num_batched_tokens": None, "enable_chunked_prefill": None, "enable_prefix_caching": None,
              "block_size": None, "tensor_parallel_size": None, "speculative_config": None,
              "max_num_seqs": {"fixed": 1}}
    space = {**pinned, "max_model_len": {"choices": [longest - 1, longest, 2 * longest]}}
    done = _tune(tmp_path, monkeypatch, "servelab-prompts", space)
    assert done.exit_code == 0, done.output
    assert [w.workload for w in _Backend.made] == ["servelab-prompts"]
    said = " ".join(done.output.split())
    assert f"max_model_len: excluded [{longest - 1}] (shorter than the workload's longest request, {longest}" in said
    missing = _tune(tmp_path / "m", monkeypatch, f"prompts:{tmp_path / 'nope.jsonl'}", space)
    assert missing.exit_code == 2 and "nope.jsonl: no such prompt file" in " ".join(missing.output.split())


def test_show_compares_with_several_mixes() -> None:
    from workloads import commands

    app = typer.Typer()
    commands.register(app, get_tokenizer=get_tokenizer)
    runner = CliRunner()
    args = ["workloads", "show", "servelab-prompts", "--tokenizer", "tiny-random", "--compare"]
    result = runner.invoke(app, [*args, "sharegpt,lmsys"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "sharegpt:" in result.output and "lmsys:" in result.output
    assert result.output.count("KS statistic") == 4  # input and output lengths against each mix
    result = runner.invoke(app, [*args, "sharegpt,nope"], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and "'nope': not a shipped mix" in result.output


def test_prompt_file_rows_carry_request_classes_for_per_class_slos(tmp_path: Path) -> None:
    from sweep.mock.calibrate import start_mock
    from sweep.point.benchmark_metrics import parse_slo
    from sweep.point.prompts import check_slo_classes
    from sweep.run.sweeper import run_sweep
    from workloads.spec import WorkloadFormatError

    path = tmp_path / "classed.jsonl"
    classes = ["interactive", "batch"] * 3
    rows = [{"prompt": f"Question {k}?", "output_len": 4, "class": c} for k, c in enumerate(classes)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    name = f"prompts:{path}"
    assert read_prompt_file(name).classes == ["batch", "interactive"]
    from workloads import commands

    app = typer.Typer()
    commands.register(app, get_tokenizer=get_tokenizer)
    shown = CliRunner().invoke(app, ["workloads", "show", name, "--tokenizer", "tiny-random"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0 and "classes: batch 3, interactive 3" in shown.output, shown.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "x", "class": "two words"}) + "\n")
    with pytest.raises(WorkloadFormatError, match="line 1: class is 'two words'"):
        read_prompt_file(f"prompts:{bad}")

    def config(slo: str, out: str) -> SweepConfig:
        return SweepConfig(output_dir=tmp_path / out, values=[2], url="http://127.0.0.1:9/v1", model="mock",
                           tokenizer="tiny-random", workload=WorkloadConfig(workload=name), num_prompts=6,
                           slo=parse_slo(slo), command="bench sweep (test)")  # fmt: skip

    with pytest.raises(ValueError, match=r"unknown class\(es\) \['chat'\].*classes are \['batch', 'interactive'\]"):
        run_sweep(config("interactive:ttft=100;chat:ttft=5", "refused"))
    with pytest.raises(ValueError, match="workload 'servelab-prompts': it carries none"):  # the shipped set: none
        check_slo_classes(WorkloadConfig(workload="servelab-prompts"), parse_slo("chat:ttft=5"), 4)
    cfg = config("interactive:ttft=60000;batch:e2el=0", "run")  # batch's 0 ms E2EL cannot be met
    with start_mock(1.0, 0.5, tmp_path / "mock.log") as mock:
        cfg.url = mock.url
        run_dir = run_sweep(cfg)
    sent = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    assert sorted(row["request_class"] for row in sent) == ["batch"] * 3 + ["interactive"] * 3
    point = json.loads(next((run_dir / "points").glob("*.json")).read_text())
    assert {c: v["slo_attainment"] for c, v in point["classes"].items()} == {"interactive": 1.0, "batch": 0.0}

    simulated = SimulateConfig(output_dir=tmp_path / "sim", profile=load_profile(_profile(tmp_path)), values=[2],
                               engine_knobs={"max_num_seqs": 2, "max_model_len": 256}, num_prompts=6,
                               workload=WorkloadConfig(workload=name), slo=parse_slo("batch:e2el=0"))  # fmt: skip
    point = load_results(run_simulation(simulated)).points.iloc[0]
    assert {c: v["slo_attainment"] for c, v in point["classes"].items()} == {"interactive": 1.0, "batch": 0.0}
