"""StructuredOutputsParams: one kind per request, the cache key, and xgrammar's verdict on specs."""

from __future__ import annotations

import pytest
import xgrammar as xgr

from engine.structured_output import StructuredOutputsError, StructuredOutputsParams
from engine.structured_output.backend_xgrammar import build_grammar, validate_structured_outputs
from engine.structured_output.params import choice_as_ebnf


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"json": {"type": "object"}, "regex": "a+"},
        {"json": "[1, 2]"},
        {"json": "{not json"},
        {"json": 5},
        {"regex": ""},
        {"choice": []},
        {"choice": ["a", ""]},
        {"choice": "a"},
        {"grammar": 3},
        {"json_object": "yes"},
    ],
)
def test_malformed_params_are_refused(fields: dict) -> None:
    with pytest.raises(StructuredOutputsError):
        StructuredOutputsParams(**fields)


def test_key_is_kind_and_normalised_spec() -> None:
    a = StructuredOutputsParams(json={"type": "object", "properties": {"x": {"type": "integer"}}})
    b = StructuredOutputsParams(json='{"properties": {"x": {"type": "integer"}}, "type": "object"}')
    assert a.key == b.key and a.key[0] == "json"
    assert StructuredOutputsParams(json=a.json, disable_any_whitespace=True).key != a.key
    assert StructuredOutputsParams(regex="a+").key == ("regex", "a+")
    assert StructuredOutputsParams(choice=["x", "y"]).key == ("choice", '["x", "y"]')
    assert StructuredOutputsParams(json_object=True).key == ("json_object", "")
    assert StructuredOutputsParams(grammar='root ::= "a"').kind == "grammar"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (StructuredOutputsParams(regex="(ab"), "parenthesis is not closed"),
        (StructuredOutputsParams(json={"type": "objectx"}), 'Unsupported type "objectx"'),
        (StructuredOutputsParams(grammar='root ::= "a" | b'), 'Rule "b" is not defined'),
    ],
)
def test_compiler_rejections_carry_its_message_without_log_noise(params: StructuredOutputsParams, message: str) -> None:
    with pytest.raises(StructuredOutputsError) as caught:
        validate_structured_outputs(params)
    text = str(caught.value)
    assert message in text and text.startswith(f"invalid {params.kind} for structured outputs: ")
    assert ".cc:" not in text


def test_choice_grammar_accepts_exactly_the_choices_even_with_quotes_and_backslashes() -> None:
    choices = ['say "hi"', "back\\slash", "tab\there", "naïve", "a"]
    grammar = xgr.Grammar.from_ebnf(choice_as_ebnf(choices))
    assert str(build_grammar(StructuredOutputsParams(choice=choices))) == str(grammar)
    for text in choices:
        assert xgr.testing._is_grammar_accept_string(grammar, text), text
    for text in ["say hi", "b", "back\\\\slash", ""]:
        assert not xgr.testing._is_grammar_accept_string(grammar, text), text


def test_the_processor_refuses_a_bad_spec_before_anything_is_queued() -> None:
    from engine.processor import Processor, RequestError
    from engine.sampling_params import SamplingParams

    processor = Processor(None, max_model_len=64, vocab_size=100, eos_token_ids=[2])
    bad = SamplingParams(structured_outputs=StructuredOutputsParams(regex="(ab"))
    with pytest.raises(RequestError) as caught:
        processor.build_request("r", [1, 2], bad)
    assert caught.value.param == "structured_outputs" and "parenthesis is not closed" in str(caught.value)
    good = SamplingParams(structured_outputs=StructuredOutputsParams(regex="(ab)+"))
    assert processor.build_request("r", [1, 2], good).sampling_params.structured_outputs == good.structured_outputs
