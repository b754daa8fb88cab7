"""Structured outputs: the `structured` workload (chat requests carrying JSON schemas of varying size, for
response_format), the bounds that make a schema's outputs finite (`bounded_values`, `max_output_chars`), and
the constraint a request carries, the body fields that send it (in one of three request shapes), and whether an
output parsed and validated.

Constraints: the `structured` workload's JSON schemas, or with `--structured-output json|regex|choice` one per
request of any workload (small generated schemas with bounded values, a rotating set of regexes or choice
lists). Shapes: `response_format` (OpenAI; JSON schemas only), `structured_outputs` (vLLM), `guided` (vLLM's
older guided_* fields).

Validation needs no third-party package: `validate_json` covers the JSON-schema keywords listed in
`SUPPORTED_KEYWORDS` (everything the workload generators emit) and a schema using any other keyword is refused
when the constraint is made, so no output is ever judged against a keyword the validator would ignore. Regexes
are checked with Python's `re.fullmatch` (the regexes sent use only syntax both it and xgrammar read alike).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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


KINDS = ("json", "regex", "choice")
SHAPES = ("response_format", "structured_outputs", "guided")
SUPPORTED_KEYWORDS = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "enum", "const",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "pattern",
    "title", "description", "$schema",
})  # fmt: skip
REGEXES = (
    r"[0-9]{3}-[0-9]{3}-[0-9]{4}",
    r"(true|false), [a-z]{3,8}",
    r"[A-Z][a-z]{2,10} [A-Z][a-z]{2,10}",
    r"#[0-9a-f]{6}",
    r"20[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9])",
)
CHOICES = (
    ["positive", "negative", "neutral"],
    ["yes", "no"],
    ["red", "green", "blue", "yellow"],
    ["low", "medium", "high", "critical"],
)
SMALL_SCHEMA_FIELDS = (1, 2, 4)  # --structured-output json: schemas a short output can complete
SCHEMA_DRAWS = 64  # schemas drawn per request until one fits its output length


class SchemaNotSupported(ValueError):
    """A schema uses a keyword `validate_json` does not check, so its outputs could not be judged."""


@dataclass(frozen=True)
class Constraint:
    kind: str  # json | regex | choice
    spec: Any  # a JSON schema (dict), a regex (str) or the choices (list[str])
    shape: str = "structured_outputs"  # the request fields that carry it (SHAPES)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"--structured-output must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.shape not in SHAPES:
            raise ValueError(f"--structured-output-shape must be one of {', '.join(SHAPES)}, got {self.shape!r}")
        if self.shape == "response_format" and self.kind != "json":
            raise ValueError(
                f"response_format carries JSON schemas only; send --structured-output {self.kind} with "
                "--structured-output-shape structured_outputs or guided"
            )
        if self.kind == "json":
            check_supported(self.spec)

    def request_fields(self) -> dict[str, Any]:
        """The request-body fields that ask for this constraint."""
        if self.shape == "response_format":
            schema = {"name": "output", "schema": self.spec, "strict": True}
            return {"response_format": {"type": "json_schema", "json_schema": schema}}
        if self.shape == "structured_outputs":
            return {"structured_outputs": {self.kind: self.spec}}
        return {f"guided_{self.kind}": self.spec}


def make_constraint(
    index: int, schema: dict | None, structured_output: str | None, shape: str | None, seed: int,
    output_len: int | None = None,
) -> Constraint | None:
    """Request `index`'s constraint: its workload schema, else (with `structured_output`) a generated one. `shape`
    None: response_format for JSON schemas, structured_outputs for regexes and choices.

    A generated JSON schema has bounded values (workloads.structured.bounded_values) and, with `output_len`, fits
    it: its longest compact output plus the EOS token is at most `output_len` tokens at one token per character
    (workloads.structured.max_output_chars), so max_tokens cannot cut short an output whose strings are plain
    ASCII (escapes and multi-byte characters can take more tokens). A request too short for any schema is a
    ValueError."""  # fmt: skip
    if structured_output is None and schema is None:
        return None
    kind = structured_output or "json"
    if kind == "json":
        spec: Any = schema if schema is not None else _fitting_schema(index, seed, output_len)
    elif kind == "regex":
        spec = REGEXES[index % len(REGEXES)]
    elif kind == "choice":
        spec = list(CHOICES[index % len(CHOICES)])
    else:
        raise ValueError(f"--structured-output must be one of {', '.join(KINDS)}, got {structured_output!r}")
    return Constraint(kind, spec, shape or ("response_format" if kind == "json" else "structured_outputs"))


def _fitting_schema(index: int, seed: int, output_len: int | None) -> dict:
    rng = np.random.default_rng([seed, index])
    smallest: tuple[int, dict] | None = None
    for _ in range(SCHEMA_DRAWS):
        spec = bounded_values(json_schema(int(rng.choice(SMALL_SCHEMA_FIELDS)), rng))
        needed = max_output_chars(spec) + 1  # + the EOS token
        if output_len is None or needed <= output_len:
            return spec
        smallest = min(smallest or (needed, spec), (needed, spec), key=lambda pair: pair[0])
    assert smallest is not None
    raise ValueError(
        f"--structured-output json: request {index}'s output length ({output_len} tokens) is too short for the "
        f"generated schemas (the smallest of {SCHEMA_DRAWS} drawn needs {smallest[0]}); raise --output-len"
    )


def output_is_valid(constraint: Constraint, text: str) -> bool:
    """Whether `text` parses and satisfies the constraint."""
    if constraint.kind == "regex":
        return re.fullmatch(constraint.spec, text) is not None
    if constraint.kind == "choice":
        return text in constraint.spec
    try:
        instance = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return False
    return validate_json(instance, constraint.spec)


def check_supported(schema: Any) -> None:
    if not isinstance(schema, dict):
        raise SchemaNotSupported(f"a JSON schema must be an object, got {type(schema).__name__}")
    unknown = set(schema) - SUPPORTED_KEYWORDS
    if unknown:
        raise SchemaNotSupported(f"the sweep cannot validate outputs of schemas using {', '.join(sorted(unknown))}")
    for child in schema.get("properties", {}).values():
        check_supported(child)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            check_supported(schema[key])


_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def validate_json(instance: Any, schema: dict) -> bool:
    """JSON-schema validation for the keywords in SUPPORTED_KEYWORDS (draft 2020-12 semantics)."""
    types = schema.get("type")
    if types is not None and not any(_TYPES[t](instance) for t in ([types] if isinstance(types, str) else types)):
        return False
    if "enum" in schema and not any(_json_equal(instance, option) for option in schema["enum"]):
        return False
    if "const" in schema and not _json_equal(instance, schema["const"]):
        return False
    if isinstance(instance, (int, float)) and not isinstance(instance, bool):
        if not math.isfinite(instance):
            return False
        if "minimum" in schema and instance < schema["minimum"]:
            return False
        if "maximum" in schema and instance > schema["maximum"]:
            return False
        if "exclusiveMinimum" in schema and instance <= schema["exclusiveMinimum"]:
            return False
        if "exclusiveMaximum" in schema and instance >= schema["exclusiveMaximum"]:
            return False
    if isinstance(instance, str):
        if len(instance) < schema.get("minLength", 0) or len(instance) > schema.get("maxLength", math.inf):
            return False
        if "pattern" in schema and re.search(schema["pattern"], instance) is None:
            return False
    if isinstance(instance, list):
        if len(instance) < schema.get("minItems", 0) or len(instance) > schema.get("maxItems", math.inf):
            return False
        if isinstance(schema.get("items"), dict) and not all(validate_json(v, schema["items"]) for v in instance):
            return False
    if isinstance(instance, dict):
        properties = schema.get("properties", {})
        if any(name not in instance for name in schema.get("required", [])):
            return False
        extra = schema.get("additionalProperties", True)
        for name, value in instance.items():
            if name in properties:
                if not validate_json(value, properties[name]):
                    return False
            elif extra is False or (isinstance(extra, dict) and not validate_json(value, extra)):
                return False
    return True


def _json_equal(a: Any, b: Any) -> bool:
    """JSON equality: 1 == 1.0, but true != 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    numbers = isinstance(a, (int, float)) and isinstance(b, (int, float))
    return (numbers or type(a) is type(b)) and a == b
