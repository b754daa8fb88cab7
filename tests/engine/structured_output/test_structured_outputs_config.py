"""The server-wide `structured_outputs_config` (vLLM's --structured-outputs-config): parsing, the error naming each bad
field, the LLM(structured_outputs_config=...) forms, and the defaults it gives requests that leave a field unset."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine.config import ConfigError, EngineConfig
from engine.engine_core import EngineCore
from engine.request import Request
from engine.sampling_params import SamplingParams
from engine.structured_output import StructuredOutputsParams
from engine.structured_output.config import StructuredOutputsConfig
from engine.structured_output.manager import StructuredOutputManager

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


def test_no_config_is_vllms_defaults() -> None:
    config = StructuredOutputsConfig.from_json(None)
    assert config == StructuredOutputsConfig("auto", False, False, False)
    assert StructuredOutputsConfig.from_json("{}") == config


def test_every_field_parses() -> None:
    raw = json.dumps({"backend": "xgrammar", "disable_any_whitespace": True, "disable_fallback": True,
                      "disable_additional_properties": True, "reasoning_parser": "",
                      "enable_in_reasoning": False})  # fmt: skip
    assert StructuredOutputsConfig.from_json(raw) == StructuredOutputsConfig("xgrammar", True, True, True)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ('{"backend": "guidance"}', "backend 'guidance' is not available: this engine compiles grammars with xgrammar"),
        ('{"backend": "outlines"}', "backend 'outlines' is not available"),
        ('{"backend": "xgrammar:no-fallback"}', "backend must be one of ('auto', 'xgrammar')"),
        ('{"disable_any_whitespace": "yes"}', "structured_outputs_config.disable_any_whitespace must be true or false"),
        ('{"disable_fallback": 1}', "structured_outputs_config.disable_fallback must be true or false"),
        ('{"reasoning_parser": "deepseek_r1"}', "structured_outputs_config.reasoning_parser is not supported"),
        ('{"enable_in_reasoning": true}', "structured_outputs_config.enable_in_reasoning is not supported"),
        ('{"whitespace_pattern": " "}', "unknown field(s) ['whitespace_pattern']"),
        ('["disable_any_whitespace"]', "must be a JSON object"),
        ("{disable_any_whitespace: true}", "is not valid JSON"),
    ],
)
def test_a_bad_config_is_a_config_error_naming_the_field(raw: str, message: str) -> None:
    with pytest.raises(ConfigError, match="structured_outputs_config") as error:
        EngineConfig.from_kwargs(model="tiny-random", structured_outputs_config=raw)
    assert message in str(error.value)


@pytest.mark.parametrize(
    "value",
    ['{"disable_any_whitespace": true}', {"disable_any_whitespace": True},
     StructuredOutputsConfig(disable_any_whitespace=True)],  # fmt: skip
)
def test_llm_takes_json_a_dict_or_the_config(value: Any) -> None:
    config = EngineConfig.from_kwargs(model="tiny-random", structured_outputs_config=value)
    assert config.structured_outputs_config.disable_any_whitespace is True
    assert isinstance(config.scheduler_config.structured_outputs_config, str)  # the knob stays JSON (the CLI flag)


def test_the_wrong_type_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="structured_outputs_config must be JSON text, a dict or a"):
        EngineConfig.from_kwargs(model="tiny-random", structured_outputs_config=3)


def test_the_config_sets_the_default_and_a_request_value_overrides_it() -> None:
    config = StructuredOutputsConfig(disable_any_whitespace=True)
    unset = StructuredOutputsParams(json=SCHEMA)
    assert unset.disable_any_whitespace is None
    assert config.apply(unset).disable_any_whitespace is True
    spaced = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=False)
    assert config.apply(spaced).disable_any_whitespace is False
    assert StructuredOutputsConfig().apply(unset).disable_any_whitespace is False


class RecordingBackend:
    """Stands in for xgrammar: records what each compile was asked for."""

    def __init__(self) -> None:
        self.compiled: list[bool | None] = []

    def compile(self, params: StructuredOutputsParams) -> object:
        self.compiled.append(params.disable_any_whitespace)
        return object()


def structured_request(rid: str, so: StructuredOutputsParams) -> Request:
    return Request(rid, [5, 6], SamplingParams(max_tokens=4, structured_outputs=so), eos_token_id=2, max_tokens=4)


def test_the_manager_compiles_with_the_default_filled_in() -> None:
    backend = RecordingBackend()
    manager = StructuredOutputManager(lambda: backend, 64, config=StructuredOutputsConfig(disable_any_whitespace=True))  # type: ignore[arg-type,return-value]
    requests = [
        structured_request("unset", StructuredOutputsParams(json=SCHEMA)),
        structured_request("compact", StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)),
        structured_request("spaced", StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=False)),
    ]
    for r in requests:
        manager.add_request(r)
    manager.wait_for_compiles(10.0)
    for r in requests:
        assert manager._states[r.request_id].future.result(timeout=10)
    assert sorted(backend.compiled) == [False, True]  # "unset" shares the compact grammar with "compact"
    assert manager.num_compiles == 2
    manager.shutdown()


def test_a_compact_engine_writes_json_without_free_whitespace() -> None:
    """tiny-random's greedy json_object output under the server-wide default: no newline, no run of spaces."""
    config = EngineConfig.from_kwargs(model="tiny-random", dtype="float32", block_size=4, max_model_len=256,
                                      structured_outputs_config={"disable_any_whitespace": True})  # fmt: skip
    core = EngineCore(config)
    so = StructuredOutputsParams(json_object=True)
    sampling = SamplingParams(max_tokens=40, temperature=0.0, structured_outputs=so)
    core.add_request(Request("r", [5, 6, 7], sampling, eos_token_id=2, max_tokens=40))
    tokens: list[int] = []
    while core.has_unfinished_requests():
        for output in core.step():
            tokens += output.new_token_ids
    from engine.tokenizer import get_tokenizer

    text = get_tokenizer("tiny-random").decode([t for t in tokens if t != 2])
    assert text.startswith("{") and "\n" not in text and "  " not in text, text
