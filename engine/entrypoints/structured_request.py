"""Structured-output fields of an OpenAI request body → StructuredOutputsParams, in the three shapes clients send:

* OpenAI `response_format`: `{"type": "text"}` (no constraint), `{"type": "json_object"}`,
  `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`;
* vLLM `structured_outputs`: `{"json" | "regex" | "choice" | "grammar" | "json_object": ...}`, optionally with
  `"disable_any_whitespace"`;
* vLLM's older `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar` fields.

Both endpoints accept all three (vLLM does). At most one shape per request. Only the shape is checked here; whether
xgrammar accepts the schema, regex or grammar is checked when the request is built (engine/processor.py), and its
error names the field the client used.
"""

from __future__ import annotations

from typing import Any

from engine.entrypoints.protocol import bad_request
from engine.structured_output import StructuredOutputsError, StructuredOutputsParams

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
_STRUCTURED_OUTPUTS_KEYS = ("json", "regex", "choice", "grammar", "json_object", "disable_any_whitespace")
_UNSUPPORTED = ("structural_tag", "whitespace_pattern", "guided_whitespace_pattern")


def parse_structured_outputs(body: dict[str, Any]) -> tuple[StructuredOutputsParams | None, str | None]:
    """(params, the request field they came from), or (None, None) when the request is unconstrained."""
    found: list[tuple[StructuredOutputsParams, str]] = []
    response_format = body.get("response_format")
    if response_format is not None:
        params = _from_response_format(response_format)
        if params is not None:
            found.append((params, "response_format"))
    raw = body.get("structured_outputs")
    if raw is not None:
        found.append((_from_structured_outputs(raw), "structured_outputs"))
    guided = {name: body[name] for name in _GUIDED if body.get(name) is not None}
    if len(guided) > 1:
        raise bad_request(f"only one of {', '.join(guided)} may be set", next(iter(guided)))
    for name, value in guided.items():
        found.append((_build({_GUIDED[name]: value}, name), name))
    for name in _UNSUPPORTED:
        if body.get(name) is not None:
            raise bad_request(f"'{name}' is not supported by this server", name)
    if len(found) > 1:
        names = ", ".join(f"'{name}'" for _, name in found)
        raise bad_request(f"a request may constrain its output in one way only; got {names}", found[1][1])
    return found[0] if found else (None, None)


def _build(fields: dict[str, Any], param: str) -> StructuredOutputsParams:
    try:
        return StructuredOutputsParams(**fields)
    except StructuredOutputsError as error:
        raise bad_request(str(error).replace("structured_outputs", param, 1), param) from error


def _from_response_format(raw: Any) -> StructuredOutputsParams | None:
    param = "response_format"
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
        raise bad_request("'response_format' must be an object with a 'type'", param)
    kind = raw["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutputsParams(json_object=True)
    if kind != "json_schema":
        raise bad_request(f"'response_format.type' must be text, json_object or json_schema, got {kind!r:.40}", param)
    spec = raw.get("json_schema")
    if not isinstance(spec, dict):
        raise bad_request("'response_format.json_schema' must be an object with a 'schema'", param)
    name = spec.get("name")
    if name is not None and not isinstance(name, str):
        raise bad_request("'response_format.json_schema.name' must be a string", param)
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise bad_request("'response_format.json_schema.schema' must be a JSON schema object", param)
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise bad_request("'response_format.json_schema.strict' must be a boolean", param)
    return _build({"json": schema}, param)


def _from_structured_outputs(raw: Any) -> StructuredOutputsParams:
    param = "structured_outputs"
    if not isinstance(raw, dict):
        raise bad_request(f"'{param}' must be an object with one of json, regex, choice, grammar, json_object", param)
    for key in _UNSUPPORTED:
        if raw.get(key) is not None:
            raise bad_request(f"'{param}.{key}' is not supported by this server", param)
    unknown = sorted(set(raw) - set(_STRUCTURED_OUTPUTS_KEYS) - set(_UNSUPPORTED))
    if unknown:
        raise bad_request(f"'{param}' has unknown field(s) {', '.join(unknown)}", param)
    if raw.get("disable_any_whitespace") not in (None, True, False):
        raise bad_request(f"'{param}.disable_any_whitespace' must be a boolean", param)
    fields = {key: value for key, value in raw.items() if value is not None and key in _STRUCTURED_OUTPUTS_KEYS}
    return _build(fields, param)
