"""Structured-output workload: chat requests carrying JSON schemas of varying size (for response_format)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from workloads.spec import RequestSpec

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
    """Attach a JSON schema to each request; its top-level field count is drawn uniformly from field_counts."""
    if not field_counts:
        raise ValueError("field_counts must not be empty")
    rng = np.random.default_rng(seed)
    return [
        dataclasses.replace(spec, schema=json_schema(int(field_counts[int(rng.integers(len(field_counts)))]), rng))
        for spec in specs
    ]
