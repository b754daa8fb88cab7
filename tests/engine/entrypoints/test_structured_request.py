"""The three request shapes of structured outputs → StructuredOutputsParams, and 400s naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from engine.entrypoints.protocol import ApiError, parse_chat_request, parse_completion_request
from engine.structured_output import StructuredOutputsParams

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
USER = [{"role": "user", "content": "x"}]


@pytest.mark.parametrize(
    ("fields", "expected", "param"),
    [
        ({"response_format": {"type": "text"}}, None, None),
        ({"response_format": {"type": "json_object"}}, StructuredOutputsParams(json_object=True), "response_format"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "n", "schema": SCHEMA, "strict": True},
                }
            },
            StructuredOutputsParams(json=SCHEMA),
            "response_format",
        ),
        ({"structured_outputs": {"regex": "a+"}}, StructuredOutputsParams(regex="a+"), "structured_outputs"),
        (
            {"structured_outputs": {"json": SCHEMA, "disable_any_whitespace": True}},
            StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True),
            "structured_outputs",
        ),
        (
            {"structured_outputs": {"json_object": True}},
            StructuredOutputsParams(json_object=True),
            "structured_outputs",
        ),
        (
            {"structured_outputs": {"grammar": 'root ::= "a"'}},
            StructuredOutputsParams(grammar='root ::= "a"'),
            "structured_outputs",
        ),  # fmt: skip
        ({"guided_json": SCHEMA}, StructuredOutputsParams(json=SCHEMA), "guided_json"),
        ({"guided_regex": "b+"}, StructuredOutputsParams(regex="b+"), "guided_regex"),
        ({"guided_choice": ["y", "n"]}, StructuredOutputsParams(choice=["y", "n"]), "guided_choice"),
        ({"guided_grammar": 'root ::= "a"'}, StructuredOutputsParams(grammar='root ::= "a"'), "guided_grammar"),
    ],
)
def test_each_shape_on_both_endpoints(fields: dict[str, Any], expected: Any, param: str | None) -> None:
    for req in (parse_chat_request({"messages": USER, **fields}), parse_completion_request({"prompt": "p", **fields})):
        assert req.sampling_params.structured_outputs == expected
        assert req.structured_outputs_param == param


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "n"}}}, "response_format"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA, "strict": "yes"}}},
            "response_format",
        ),  # fmt: skip
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"response_format": "json"}, "response_format"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
        ({"structured_outputs": {}}, "structured_outputs"),
        ({"structured_outputs": {"regexp": "a"}}, "structured_outputs"),
        ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs"),
        ({"structured_outputs": "a+"}, "structured_outputs"),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_json": SCHEMA, "guided_regex": "a"}, "guided_json"),
        ({"guided_regex": "a", "structured_outputs": {"regex": "a"}}, "guided_regex"),
        ({"guided_whitespace_pattern": " "}, "guided_whitespace_pattern"),
    ],
)
def test_malformed_shapes_are_400_naming_the_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse_completion_request({"prompt": "p", **fields})
    assert caught.value.status == 400 and caught.value.param == param and caught.value.message


def test_the_servelab_field_carries_grammar_timing() -> None:
    from engine.entrypoints.serving_engine import grammar_timing
    from engine.request import RequestTiming

    assert grammar_timing(RequestTiming()) == {
        "grammar_compile_time": None, "grammar_bitmask_time": None, "grammar_bitmask_time_per_step": None
    }  # fmt: skip
    timing = RequestTiming(grammar_compile_time=0.0, grammar_bitmask_time=0.004, num_grammar_bitmask_steps=8)
    assert grammar_timing(timing) == {
        "grammar_compile_time": 0.0, "grammar_bitmask_time": 0.004, "grammar_bitmask_time_per_step": 0.0005
    }  # fmt: skip
