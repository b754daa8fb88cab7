"""`with_load_options`: the load, workload and SLO flags declared once, handed to a command as `LoadOptions`."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from sweep.cli_options import SHARED_OPTIONS, LoadOptions, with_load_options
from sweep.run.load_config import LoadConfig


def app_with(command: object) -> typer.Typer:
    app = typer.Typer()
    app.command()(command)
    app.command("other")(lambda: None)  # two commands: the first is addressed by name
    return app


def test_the_options_replace_the_load_parameter_and_build_a_load_config(tmp_path: Path) -> None:
    seen: dict[str, LoadConfig] = {}

    @with_load_options(exclude=("endpoint",), help={"duration": "Simulated seconds."})
    def run(load: LoadOptions, name: str = typer.Option("x")) -> None:
        seen["config"] = load.config(LoadConfig, workload={"seed": 3})

    app = app_with(run)
    result = CliRunner().invoke(app, ["run", "--request-rate", "1,2", "--slo", "ttft=500", "--input-len", "64"])
    assert result.exit_code == 0, result.output
    config = seen["config"]
    assert (config.mode, config.values, config.slo) == ("rate", [1.0, 2.0], {"ttft_ms": 500.0})
    assert (config.workload.input_len, config.workload.output_len, config.workload.seed) == (64, 128, 3)
    assert config.workload.endpoint == SHARED_OPTIONS["endpoint"].default and config.num_prompts == 200
    help_text = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "200"}).output
    assert "--max-load-under-slo" in help_text and "Simulated seconds." in help_text
    assert "--endpoint" not in help_text


def test_exactly_one_load_is_a_usage_error() -> None:
    @with_load_options()
    def run(load: LoadOptions) -> None:
        load.config(LoadConfig)

    result = CliRunner().invoke(app_with(run), ["run", "--concurrency", "1", "--request-rate", "2"])
    assert result.exit_code == 2 and "exactly one of --concurrency" in result.output


def test_a_command_declares_no_load_option_itself() -> None:
    def run(load: LoadOptions, duration: float = 1.0) -> None: ...

    with pytest.raises(TypeError, match="duration"):
        with_load_options()(run)
    with pytest.raises(ValueError, match="not load options"):
        with_load_options(exclude=("nonsense",))
