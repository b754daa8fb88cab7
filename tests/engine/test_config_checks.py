"""The config checks: a Literal-typed field is checked against its values, the choices read off the type."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pytest

from engine.config import DTYPES, CacheConfig, ModelConfig, engine_knobs
from engine.config_checks import ConfigError, check_choices, literal_choices


@dataclass
class _Example:
    mode: Literal["a", "b"] = "a"
    optional: Literal[1, 2] | None = None
    free: str = "x"


def test_literal_fields_and_their_values() -> None:
    assert literal_choices(_Example) == {"mode": ("a", "b"), "optional": (1, 2)}
    check_choices(_Example("b", 2))
    with pytest.raises(ConfigError, match=r"mode must be one of \('a', 'b'\), got 'c'"):
        check_choices(_Example("c"))  # type: ignore[arg-type]


def test_the_engine_choice_knobs_come_from_their_types() -> None:
    choices = {name: spec.choices for name, spec in engine_knobs().items() if spec.choices is not None}
    assert set(choices) == {"dtype", "device", "quantization", "kv_cache_dtype", "attention_backend"}
    assert choices["dtype"] == DTYPES and engine_knobs()["dtype"].value_type is str
    with pytest.raises(ConfigError, match="kv_cache_dtype must be one of"):
        CacheConfig(kv_cache_dtype="fp8")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="quantization must be one of"):
        ModelConfig(quantization="fp8")  # type: ignore[arg-type]
