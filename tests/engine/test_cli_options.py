"""The engine-knob options are generated from the config fields: `bench serve`, `bench throughput` and
`bench sweep` list the same flags, and every knob set on any of them reaches the engine config."""

from __future__ import annotations

import re
from typing import Any

import pytest
from typer.testing import CliRunner

from cli import app
from engine.cli_options import with_engine_knobs
from engine.config import EngineConfig, engine_knobs

COMMANDS = ("serve", "throughput", "sweep")

# A value other than the default for every knob.
KNOB_VALUES: dict[str, Any] = {
    "model": "tiny-random", "tokenizer": "tiny-random", "dtype": "float32", "max_model_len": 64, "seed": 4,
    "device": "cpu", "quantization": "int8", "quantization_group_size": 64, "quantization_skip": "lm_head",
    "enable_prefix_caching": False, "block_size": 32,
    "gpu_memory_utilization": 0.5, "kv_cache_memory_bytes": 2**20,
    "num_gpu_blocks_override": 20, "kv_cache_dtype": "bfloat16", "max_num_seqs": 3,
    "max_num_batched_tokens": 96,
    "enable_chunked_prefill": False, "inject_step_delay_ms": 1.5, "tensor_parallel_size": 2, "cpu_threads": 1,
    "attention_backend": "torch", "enforce_eager": True,
    "speculative_config": '{"method": "ngram", "num_speculative_tokens": 3}',
    "structured_outputs_config": '{"disable_any_whitespace": true}',
}  # fmt: skip


def knob_arguments(knobs: dict[str, Any]) -> list[str]:
    return [arg for name, value in knobs.items() for arg in engine_knobs()[name].args(value)]


def engine_panel_flags(help_text: str) -> set[str]:
    """The flags in the "Engine knobs" panel of a command's rich --help (the first column of each row)."""
    lines = help_text.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"╭─ Engine knobs ─", line))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("╰"))
    return {flag for line in lines[start + 1 : end] for flag in re.findall(r"--[a-z0-9-]+", line.split("<")[0])}


def capture_sweeps(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """`bench sweep` records the SweepConfig it would run, then stops with "stop here"."""
    import sweep.run.sweeper

    configs: list[Any] = []

    def fake_run_sweep(config: Any) -> Any:
        configs.append(config)
        raise RuntimeError("stop here")

    monkeypatch.setattr(sweep.run.sweeper, "run_sweep", fake_run_sweep)
    return configs


def test_the_table_covers_every_knob() -> None:
    assert set(KNOB_VALUES) == set(engine_knobs())
    EngineConfig.from_kwargs(**KNOB_VALUES)


@pytest.mark.parametrize("command", COMMANDS)
def test_help_lists_exactly_the_flags_declared_on_the_config_fields(command: str) -> None:
    declared = {flag for spec in engine_knobs().values() for flag in spec.flags}
    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "240"})
    assert result.exit_code == 0, result.output
    assert engine_panel_flags(result.output) == declared


def test_serve_passes_every_knob(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.entrypoints import cli

    seen: dict[str, Any] = {}
    monkeypatch.setattr(cli, "run_server", lambda knobs, **options: seen.update(knobs) or 0)
    result = CliRunner().invoke(app, ["serve", *knob_arguments(KNOB_VALUES)])
    assert result.exit_code == 0, result.output
    assert seen == KNOB_VALUES


def test_throughput_passes_every_knob(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.benchmarks import throughput

    seen: dict[str, Any] = {}

    def fake_run_engine(model: str, requests: list, knobs: dict[str, Any]) -> Any:
        seen.update(model=model, **knobs)
        raise ValueError("stop here")

    monkeypatch.setattr(throughput, "run_engine", fake_run_engine)
    args = ["throughput", "--num-prompts", "1", "--input-len", "4", "--output-len", "2"]
    result = CliRunner().invoke(app, [*args, *knob_arguments(KNOB_VALUES)])
    assert result.exit_code == 1 and "stop here" in result.output
    assert seen == KNOB_VALUES


def test_sweep_launches_the_engine_with_every_knob(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.entrypoints import cli
    from sweep.run.launcher import builtin_command

    configs = capture_sweeps(monkeypatch)
    result = CliRunner().invoke(app, ["sweep", "--concurrency", "1", *knob_arguments(KNOB_VALUES)])
    assert result.exit_code == 2 and "stop here" in result.output
    (config,) = configs
    assert {"model": config.model, **config.engine_knobs} == KNOB_VALUES
    assert (config.tokenizer, config.workload.seed, config.workload.max_model_len) == ("tiny-random", 4, 64)

    launched: dict[str, Any] = {}  # the launched `bench serve` parses its flags back into the same knobs
    monkeypatch.setattr(cli, "run_server", lambda knobs, **options: launched.update(knobs) or 0)
    command = builtin_command(config.model, "127.0.0.1", 9, config.engine_knobs)
    assert command[1:4] == ["-m", "cli", "serve"]
    assert CliRunner().invoke(app, command[3:]).exit_code == 0
    assert launched == KNOB_VALUES


def test_sweep_keeps_its_own_flags_usable_against_any_server(monkeypatch: pytest.MonkeyPatch) -> None:
    configs = capture_sweeps(monkeypatch)
    args = ["sweep", "--url", "http://127.0.0.1:9/v1", "--concurrency", "1", "--model", "m", "--tokenizer",
            "tiny-random", "--seed", "7", "--max-model-len", "128"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "stop here" in result.output
    (config,) = configs
    assert config.engine_knobs == {} and config.workload.seed == 7 and config.workload.max_model_len == 128
    refused = CliRunner().invoke(app, [*args, "--device", "cpu"])
    assert refused.exit_code == 2 and "engine knobs apply only to the built-in engine" in refused.output


def test_unset_knobs_keep_the_engine_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    configs = capture_sweeps(monkeypatch)
    assert CliRunner().invoke(app, ["sweep", "--concurrency", "1"]).exit_code == 2
    assert configs[0].engine_knobs == {} and configs[0].workload.seed == 0


def test_a_command_needs_the_knobs_parameter() -> None:
    def command(model: str = "m") -> None: ...

    with pytest.raises(TypeError, match="engine_knobs"):
        with_engine_knobs(command)


def test_a_renamed_command_runs_as_before_and_names_its_new_spelling() -> None:
    """`bench prepare-model` is hidden from --help and still works, with one note naming `bench model prepare`."""
    listed = CliRunner().invoke(app, ["--help"]).output
    old = CliRunner().invoke(app, ["prepare-model", "tiny-random"])
    new = CliRunner().invoke(app, ["model", "prepare", "tiny-random"])
    assert "prepare-model" not in listed and "model" in listed
    assert old.exit_code == 0 and new.exit_code == 0, (old.output, new.output)
    assert "`bench model prepare`" in old.stderr and "`bench model prepare`" not in new.stderr


def test_a_choice_knob_lists_its_values_and_refuses_others() -> None:
    """A Literal-typed field's values are the option's: --help shows them and typer refuses anything else."""
    result = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "240"})
    assert "<auto|torch|triton|cpu>" in result.output and "<none|int8|int4>" in result.output
    refused = CliRunner().invoke(app, ["serve", "--quantization", "fp8"])
    assert refused.exit_code == 2 and "fp8" in refused.output
