"""Structured-output workload: chat requests carrying JSON schemas of varying size (for response_format); and the
bounds that make a schema's outputs finite (`bounded_values`, `max_output_chars`)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

import numpy as np

from workloads.spec import RequestSpec

MAX_STRING_LENGTH = 24  # bounded_values: free-text strings
NUMBER_RANGE = (0, 9999)  # ... integers and numbers
MAX_ITEMS = 4  # ... arrays
NUMBER_FRACTION_DIGITS = 6  # xgrammar's digits after the point for a number with a range
_SCALARS = ({"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"})
_NAMES = (
    "id",
    "name",
    "title",
    "count",
    "score",
    "price",
    "active",
    "tags",
    "owner",
    "city",
    "status",
    "items",
    "email",
    "notes",
    "level",
    "color",
    "date",
    "rank",
    "label",
    "value",
)


def json_schema(num_fields: int, rng: np.random.Generator, depth: int = 0) -> dict:
    """An object schema with num_fields required properties: scalars, enums, arrays and (shallow) nested objects."""
    if num_fields < 1:
        raise ValueError(f"num_fields must be >= 1, got {num_fields}")
    properties: dict[str, dict] = {}
    for index in range(num_fields):
        name = f"{_NAMES[index % len(_NAMES)]}_{index}"
        kind = int(rng.integers(0, 6 if depth < 2 else 4))
        if kind < 4:
            properties[name] = dict(_SCALARS[int(rng.integers(0, len(_SCALARS)))])
        elif kind == 4:
            properties[name] = {"type": "array", "items": dict(_SCALARS[int(rng.integers(0, 2))]), "maxItems": 8}
        else:
            properties[name] = json_schema(int(rng.integers(1, 5)), rng, depth + 1)
        if properties[name].get("type") == "string" and rng.random() < 0.3:
            properties[name] = {"type": "string", "enum": [f"option_{k}" for k in range(int(rng.integers(2, 6)))]}
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


def schema_size(schema: dict) -> int:
    """Number of properties, nested ones included."""
    properties = schema.get("properties", {})
    return len(properties) + sum(schema_size(child) for child in properties.values() if child.get("type") == "object")


def with_schemas(
    specs: Sequence[RequestSpec], field_counts: Sequence[int] = (1, 4, 16, 64), seed: int = 0
) -> list[RequestSpec]:
    """Attach a bounded JSON schema to each request; its top-level field count is drawn uniformly from field_counts.

    A request's output length is raised where needed to the schema's longest compact output plus EOS at one token
    per character (`max_output_chars`), so max_tokens never cuts a valid output short: a structured output's length
    is set by its schema, and a 64-field schema's output is longer than most drawn output lengths."""
    if not field_counts:
        raise ValueError("field_counts must not be empty")
    rng = np.random.default_rng(seed)
    attached = []
    for spec in specs:
        schema = bounded_values(json_schema(int(field_counts[int(rng.integers(len(field_counts)))]), rng))
        output_len = max(spec.output_len, max_output_chars(schema) + 1)
        attached.append(dataclasses.replace(spec, schema=schema, output_len=output_len))
    return attached


def bounded_values(schema: dict) -> dict:
    """`schema` with every free value bounded, so that no valid output is endless: free-text strings get a
    maxLength, integers and numbers a range (xgrammar then allows a bounded number of digits, six after the point),
    arrays at most MAX_ITEMS items. Unbounded, a small model can spend all its tokens on one value, digits after
    digits of a number or one long string, until max_tokens cuts the output short of valid JSON."""
    schema = dict(schema)
    kind = schema.get("type")
    if kind == "string" and "enum" not in schema:
        schema.setdefault("maxLength", MAX_STRING_LENGTH)
    bounds = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
    if kind in ("integer", "number") and not bounds & set(schema):
        schema["minimum"], schema["maximum"] = NUMBER_RANGE
    if kind == "array":
        schema["maxItems"] = min(schema.get("maxItems", MAX_ITEMS), MAX_ITEMS)
    if "properties" in schema:
        schema["properties"] = {k: bounded_values(v) for k, v in schema["properties"].items()}
    if isinstance(schema.get("items"), dict):
        schema["items"] = bounded_values(schema["items"])
    return schema


def max_output_chars(schema: dict) -> int:
    """The longest compact output (xgrammar's separators with disable_any_whitespace: `, ` and `: `) of a schema
    from `bounded_values(json_schema(...))`, strings counted at one character per character of maxLength (no escape
    sequences, no multi-byte characters). At one token per character this bounds the output's tokens."""
    if "enum" in schema:
        return max(len(json.dumps(option)) for option in schema["enum"])
    kind = schema.get("type")
    needed = {"array": ("maxItems",), "string": ("maxLength",), "integer": ("minimum", "maximum")}
    if any(key not in schema for key in needed.get("integer" if kind == "number" else str(kind), ())):
        raise ValueError(f"max_output_chars: unbounded schema {schema!r:.80} (see bounded_values)")
    if kind == "object":
        properties = schema.get("properties", {})
        fields = [len(json.dumps(name)) + 2 + max_output_chars(child) for name, child in properties.items()]
        return 2 + sum(fields) + 2 * max(len(fields) - 1, 0)
    if kind == "array":
        items = schema["maxItems"]
        return 2 + items * max_output_chars(schema["items"]) + 2 * max(items - 1, 0)
    if kind == "string":
        return 2 + schema["maxLength"]
    if kind in ("integer", "number"):
        digits = max(len(str(int(schema["minimum"]))), len(str(int(schema["maximum"]))))
        return digits + (1 + NUMBER_FRACTION_DIGITS if kind == "number" else 0)
    if kind == "boolean":
        return len("false")
    raise ValueError(f"max_output_chars: unsupported schema {schema!r:.80}")
