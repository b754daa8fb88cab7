"""What a request asks its output to follow: vLLM's StructuredOutputsParams (one of json, regex, choice, grammar,
json_object) and its grammar key, (kind, spec), by which compiled grammars are cached.

This module imports neither torch nor xgrammar: SamplingParams carries these params into any process.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

KINDS = ("json", "regex", "choice", "grammar", "json_object")


class StructuredOutputsError(ValueError):
    """A structured-outputs spec is malformed or rejected by the grammar compiler; the message says why."""


@dataclass(frozen=True)
class StructuredOutputsParams:
    """Exactly one of `json` (a JSON schema, as a dict or its JSON text), `regex`, `choice` (the output is one of
    these strings), `grammar` (xgrammar EBNF) or `json_object=True` (any JSON object) is set.

    `disable_any_whitespace` (vLLM's name) makes JSON outputs compact: no whitespace between tokens beyond one
    space after `:` and `,` (xgrammar's default separators), which keeps small models from filling max_tokens
    with newlines. None (unset) takes the engine's `structured_outputs_config` default (off unless configured);
    True or False overrides it for this request.
    """

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool | None = None

    def __post_init__(self) -> None:
        chosen = [kind for kind in KINDS if getattr(self, kind) not in (None, False)]
        if len(chosen) != 1:
            got = ", ".join(chosen) if chosen else "none"
            raise StructuredOutputsError(f"structured_outputs needs exactly one of {', '.join(KINDS)}; got {got}")
        if self.json is not None and not isinstance(self.json, (str, dict)):
            raise StructuredOutputsError(f"structured_outputs.json must be a JSON schema object, got {self.json!r:.60}")
        if isinstance(self.json, str):
            try:
                schema = json.loads(self.json)
            except json.JSONDecodeError as error:
                raise StructuredOutputsError(f"structured_outputs.json is not valid JSON: {error}") from error
            if not isinstance(schema, dict):
                raise StructuredOutputsError("structured_outputs.json must be a JSON schema object")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise StructuredOutputsError(f"structured_outputs.{name} must be a non-empty string")
        if self.choice is not None:
            choice = self.choice
            if not isinstance(choice, list) or not choice or not all(isinstance(c, str) and c for c in choice):
                raise StructuredOutputsError("structured_outputs.choice must be a non-empty list of non-empty strings")
        if self.json_object not in (None, True, False):
            raise StructuredOutputsError("structured_outputs.json_object must be a boolean")
        if self.disable_any_whitespace is not None and not isinstance(self.disable_any_whitespace, bool):
            raise StructuredOutputsError("structured_outputs.disable_any_whitespace must be a boolean")

    @property
    def kind(self) -> str:
        return next(kind for kind in KINDS if getattr(self, kind) not in (None, False))

    @property
    def key(self) -> tuple[str, str]:
        """(kind, spec): the compiled-grammar cache key. JSON schemas are serialised with sorted keys, so two
        spellings of one schema share an entry; the whitespace option is part of a JSON spec."""
        kind = self.kind
        if kind == "json":
            schema = json.loads(self.json) if isinstance(self.json, str) else self.json
            spec = json.dumps(schema, sort_keys=True, separators=(",", ":"))
        elif kind == "choice":
            spec = json.dumps(self.choice)
        elif kind == "json_object":
            spec = ""
        else:
            spec = getattr(self, kind)
        if kind in ("json", "json_object") and self.disable_any_whitespace:
            spec += "\x00compact"
        return kind, spec


def choice_as_ebnf(choices: list[str]) -> str:
    """An EBNF grammar whose language is exactly `choices` (each a quoted literal, escaped for xgrammar)."""

    def literal(text: str) -> str:
        return '"' + json.dumps(text, ensure_ascii=False)[1:-1] + '"'

    return "root ::= " + " | ".join(literal(choice) for choice in choices)
