"""The server-wide structured-outputs configuration: vLLM's `--structured-outputs-config` (StructuredOutputsConfig).

It sets the defaults of every structured request. This engine compiles grammars with xgrammar only, so of vLLM's
fields it takes:

* `backend`: `auto` or `xgrammar` (both mean xgrammar); `guidance`, `outlines` and `lm-format-enforcer` are refused;
* `disable_any_whitespace`: JSON outputs (schemas and json_object) are compact, no whitespace between tokens beyond
  one space after `:` and `,`; a request's own `structured_outputs.disable_any_whitespace` overrides it;
* `disable_fallback`: accepted either way; there is no other backend to fall back to, so a spec xgrammar refuses is
  a 400 whatever its value (vLLM's behaviour with `disable_fallback: true`);
* `disable_additional_properties`: accepted either way; in vLLM it changes the guidance backend only, to match
  xgrammar, which (here as in vLLM) compiles schemas strictly: no properties beyond a schema's own unless it allows
  them with `additionalProperties`.

vLLM's reasoning fields (`reasoning_parser`, `reasoning_parser_plugin`, `enable_in_reasoning`) are refused unless
left at their defaults: this engine has no reasoning parsers. Anything else is a ConfigError naming the field.

This module imports neither torch nor xgrammar.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, fields
from typing import Any

from engine.config_checks import ConfigError
from engine.structured_output.params import StructuredOutputsParams

BACKENDS = ("auto", "xgrammar")
_OTHER_BACKENDS = ("guidance", "outlines", "lm-format-enforcer")
# vLLM fields this engine does not implement, with their defaults (accepted) and why another value is refused.
_UNSUPPORTED = {
    "reasoning_parser": ("", "this engine has no reasoning parsers"),
    "reasoning_parser_plugin": ("", "this engine has no reasoning parsers"),
    "enable_in_reasoning": (False, "this engine has no reasoning parsers"),
}


@dataclass(frozen=True)
class StructuredOutputsConfig:
    """The parsed `structured_outputs_config` knob, with vLLM's field names and defaults."""

    backend: str = "auto"
    disable_any_whitespace: bool = False
    disable_fallback: bool = False
    disable_additional_properties: bool = False

    def __post_init__(self) -> None:
        if self.backend in _OTHER_BACKENDS:
            raise ConfigError(
                f"structured_outputs_config.backend {self.backend!r} is not available: this engine compiles grammars "
                f"with xgrammar only; use one of {BACKENDS}"
            )
        if self.backend not in BACKENDS:
            raise ConfigError(
                f"structured_outputs_config.backend must be one of {BACKENDS}, got {self.backend!r}"
            )
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "backend" and not isinstance(value, bool):
                raise ConfigError(
                    f"structured_outputs_config.{f.name} must be true or false, got {value!r}"
                )

    @classmethod
    def from_json(cls, raw: str | None) -> StructuredOutputsConfig:
        """vLLM's defaults for no config; a ConfigError naming the field for a bad one."""
        if raw is None:
            return cls()
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as error:
            raise ConfigError(
                f"structured_outputs_config is not valid JSON ({error}): {raw!r}"
            ) from None
        if not isinstance(data, dict):
            raise ConfigError(f"structured_outputs_config must be a JSON object, got {raw!r}")
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StructuredOutputsConfig:
        names = [f.name for f in fields(cls)]
        for name, (default, reason) in _UNSUPPORTED.items():
            if name in data and data[name] != default:
                raise ConfigError(
                    f"structured_outputs_config.{name} is not supported: {reason} (got {data[name]!r})"
                )
        unknown = sorted(set(data) - set(names) - set(_UNSUPPORTED))
        if unknown:
            raise ConfigError(
                f"structured_outputs_config: unknown field(s) {unknown}; the fields are {names}"
            )
        return cls(**{name: data[name] for name in names if name in data})

    @staticmethod
    def to_json(value: str | dict[str, Any] | StructuredOutputsConfig | None) -> str | None:
        """The knob's JSON text from what `LLM(structured_outputs_config=...)` takes: JSON, a dict or this class."""
        if isinstance(value, StructuredOutputsConfig):
            return json.dumps(dataclasses.asdict(value))
        if isinstance(value, dict):
            return json.dumps(value)
        if value is not None and not isinstance(value, str):
            raise ConfigError(
                f"structured_outputs_config must be JSON text, a dict or a StructuredOutputsConfig, got "
                f"{type(value).__name__}"
            )
        return value

    def apply(self, params: StructuredOutputsParams) -> StructuredOutputsParams:
        """`params` with the server-wide defaults filled in where the request left them unset (None)."""
        if params.disable_any_whitespace is not None:
            return params
        return dataclasses.replace(params, disable_any_whitespace=self.disable_any_whitespace)
