"""`bench serve` flags: vLLM's names reach the engine config and the server options unchanged."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from cli import app
from engine.config import ConfigError, EngineConfig
from engine.entrypoints import cli


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def fake_run_server(knobs: dict[str, Any], **options: Any) -> int:
        seen["knobs"], seen["options"] = knobs, options
        return 0

    monkeypatch.setattr(cli, "run_server", fake_run_server)
    monkeypatch.delenv("SERVELAB_API_KEY", raising=False)
    return seen


def test_every_engine_knob_under_its_vllm_flag(captured: dict[str, Any]) -> None:
    args = [
        "serve", "--model", "tiny-random", "--host", "0.0.0.0", "--port", "9001", "--api-key", "k",
        "--served-model-name", "mine", "--max-model-len", "128", "--gpu-memory-utilization", "0.5",
        "--max-num-seqs", "4", "--max-num-batched-tokens", "64", "--no-enable-prefix-caching",
        "--enable-chunked-prefill", "--block-size", "32", "--dtype", "float32", "--seed", "5",
        "--num-gpu-blocks-override", "40", "--device", "cpu",
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    knobs = captured["knobs"]
    assert knobs == {
        "model": "tiny-random", "max_model_len": 128, "gpu_memory_utilization": 0.5, "max_num_seqs": 4,
        "max_num_batched_tokens": 64, "enable_prefix_caching": False, "enable_chunked_prefill": True,
        "block_size": 32, "dtype": "float32", "seed": 5, "num_gpu_blocks_override": 40, "device": "cpu",
    }  # fmt: skip
    EngineConfig.from_kwargs(**knobs)  # every flag is a knob the engine knows
    options = captured["options"]
    assert (options["host"], options["port"], options["api_key"], options["served_model_name"]) == (
        "0.0.0.0", 9001, "k", "mine",
    )  # fmt: skip


def test_defaults_bind_localhost_and_leave_engine_defaults_alone(captured: dict[str, Any]) -> None:
    result = CliRunner().invoke(app, ["serve"])
    assert result.exit_code == 0, result.output
    assert captured["knobs"] == {"model": "smollm2-135m"}
    assert (captured["options"]["host"], captured["options"]["port"]) == ("127.0.0.1", 8000)
    assert captured["options"]["api_key"] is None


def test_positional_model_like_vllm_serve(captured: dict[str, Any]) -> None:
    assert CliRunner().invoke(app, ["serve", "tiny-random"]).exit_code == 0
    assert captured["knobs"]["model"] == "tiny-random"
    result = CliRunner().invoke(app, ["serve", "tiny-random", "--model", "smollm2-135m"])
    assert result.exit_code != 0 and "differ" in result.output


def test_bad_knob_is_a_clear_error_without_loading_anything() -> None:
    result = CliRunner().invoke(app, ["serve", "--model", "tiny-random", "--block-size", "24", "--port", "0"])
    assert result.exit_code == 1 and "block_size must be a positive power of two" in result.output


def test_bad_structured_outputs_config_is_a_clear_error_naming_the_field() -> None:
    config = '{"backend": "guidance"}'
    result = CliRunner().invoke(app, ["serve", "--model", "tiny-random", "--structured-outputs-config", config])
    assert result.exit_code == 1
    assert "structured_outputs_config.backend 'guidance' is not available" in result.output


@pytest.mark.parametrize(("flags", "message"), [
    (["--quantization", "fp8"], "'fp8' is not one of 'none', 'int8', 'int4'"),
    (["--kv-cache-dtype", "fp8"], "'fp8' is not one of 'auto', 'bfloat16'"),
])  # fmt: skip
def test_fp8_is_refused_at_start_naming_the_knob_and_what_exists(flags: list[str], message: str) -> None:
    """fp8 is implemented nowhere: `bench serve` refuses the flag's value (a usage error, exit 2) listing the
    choices, before binding a port or loading."""
    result = CliRunner().invoke(
        app, ["serve", "--model", "tiny-random", "--device", "cpu", "--port", "0", *flags], env={"COLUMNS": "240"}
    )
    assert result.exit_code == 2 and f"Invalid value for '{flags[0]}'" in result.output and message in result.output


def test_fp8_is_refused_by_the_config_naming_the_knob_and_what_exists() -> None:
    """The same from Python (LLM(...), a JSON config file): the config's check lists the Literal's values."""
    with pytest.raises(ConfigError, match=r"quantization must be one of \('none', 'int8', 'int4'\), got 'fp8'"):
        EngineConfig.from_kwargs(model="tiny-random", quantization="fp8")
