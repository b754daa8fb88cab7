import json

import numpy as np
import pytest

import workloads
from workloads.structured import NUMBER_FRACTION_DIGITS, bounded_values, json_schema, max_output_chars, schema_size


def walk(schema):
    assert schema["type"] == "object" and set(schema["required"]) == set(schema["properties"])
    for child in schema["properties"].values():
        if child.get("type") == "object":
            walk(child)
        elif child.get("type") == "array":
            assert child["items"]["type"] in ("string", "integer")
        else:
            assert child.get("type") in ("string", "integer", "number", "boolean")


def test_schemas_are_valid_objects_of_the_requested_size():
    rng = np.random.default_rng(0)
    for fields in (1, 4, 16, 64):
        schema = json_schema(fields, rng)
        walk(schema)
        assert len(schema["properties"]) == fields and schema_size(schema) >= fields
        assert json.loads(json.dumps(schema)) == schema


def test_structured_workload_varies_schema_size():
    specs = workloads.load("structured", num_requests=200, seed=0)
    sizes = {len(s.schema["properties"]) for s in specs}
    assert sizes == {1, 4, 16, 64}
    assert len({json.dumps(s.schema) for s in specs}) > 150


def longest_instance(schema):
    """The longest valid value of a bounded schema, as max_output_chars counts it."""
    if "enum" in schema:
        return max(schema["enum"], key=lambda option: len(json.dumps(option)))
    kind = schema["type"]
    if kind == "object":
        return {name: longest_instance(child) for name, child in schema["properties"].items()}
    if kind == "array":
        return [longest_instance(schema["items"])] * schema["maxItems"]
    if kind == "string":
        return "x" * schema["maxLength"]
    if kind == "integer":
        return schema["maximum"]
    if kind == "number":
        return float(f"{schema['maximum'] - 1}.{'9' * NUMBER_FRACTION_DIGITS}")
    return False


def test_bounded_schemas_have_a_longest_output_xgrammar_accepts():
    import xgrammar as xgr
    from xgrammar.testing import _is_grammar_accept_string

    rng = np.random.default_rng(1)
    for fields in (1, 2, 4, 16):
        schema = bounded_values(json_schema(fields, rng))
        longest = json.dumps(longest_instance(schema), separators=(", ", ": "))
        assert len(longest) == max_output_chars(schema)
        grammar = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)
        assert _is_grammar_accept_string(grammar, longest)
        assert not _is_grammar_accept_string(grammar, longest.replace(": ", ":  ", 1))  # no free whitespace
    with pytest.raises(ValueError, match="unbounded"):
        max_output_chars({"type": "string"})


def test_bounded_values_keeps_the_schemas_own_bounds():
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3}, "s": {"type": "string"},
              "a": {"type": "array", "items": {"type": "number"}, "maxItems": 2}}, "required": ["n", "s", "a"]}
    bounded = bounded_values(schema)["properties"]
    assert bounded["n"] == {"type": "integer", "minimum": 3}  # a bound of its own: left as it is
    assert bounded["s"]["maxLength"] == 24 and bounded["a"]["maxItems"] == 2
    assert (bounded["a"]["items"]["minimum"], bounded["a"]["items"]["maximum"]) == (0, 9999)


def test_structured_workload_schemas_are_bounded_and_fit_their_output_length():
    specs = workloads.load("structured", num_requests=64, seed=3, output_len=32)
    assert any(spec.output_len > 32 for spec in specs)
    for spec in specs:
        assert spec.schema == bounded_values(spec.schema)
        assert spec.output_len >= max_output_chars(spec.schema) + 1
        assert spec.output_len >= 32
