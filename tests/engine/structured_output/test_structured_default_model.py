"""With the default model (smollm2-135m) through LLM.generate, every structured output parses and validates."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from engine import LLM, SamplingParams, StructuredOutputsParams

pytestmark = pytest.mark.slow

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 24},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
        "tags": {"type": "array", "items": {"enum": ["friend", "family", "work"]}, "minItems": 1, "maxItems": 3},
        "score": {"type": "number", "minimum": 0, "maximum": 10},
        "status": {"enum": ["active", "inactive"]},
    },
    "required": ["name", "age", "address", "tags", "score", "status"],
    "additionalProperties": False,
}
ORDER = {
    "type": "object",
    "properties": {
        "order_id": {"type": "integer", "minimum": 1000, "maximum": 9999},
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "pattern": "^[A-Z]{3}$"},
                    "qty": {"type": "integer", "minimum": 1, "maximum": 9},
                },
                "required": ["sku", "qty"],
                "additionalProperties": False,
            },
            "minItems": 1,
            "maxItems": 2,
        },
        "paid": {"type": "boolean"},
    },
    "required": ["order_id", "items", "paid"],
    "additionalProperties": False,
}
SCHEMAS = {"person": PERSON, "order": ORDER}
REGEXES = {"phone": r"\(\d{3}\) \d{3}-\d{4}", "date": r"20\d{2}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d)"}
CHOICES = {"sentiment": ["positive", "negative", "neutral"], "answer": ["yes", "no"]}


def test_every_output_parses_and_validates() -> None:
    llm = LLM("smollm2-135m", max_model_len=512)
    tokenizer = llm.get_tokenizer()

    def chat(text: str) -> str:
        messages = [{"role": "user", "content": text}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    cases = (
        [(chat(f"Give an example {name} as JSON."), StructuredOutputsParams(json=s)) for name, s in SCHEMAS.items()]
        + [(chat(f"Write a {name}."), StructuredOutputsParams(regex=r)) for name, r in REGEXES.items()]
        + [(chat("I loved this film. Sentiment?"), StructuredOutputsParams(choice=CHOICES["sentiment"])),
           (chat("Is the sky green?"), StructuredOutputsParams(choice=CHOICES["answer"]))]
    )  # fmt: skip
    params = [SamplingParams(temperature=0.0, max_tokens=160, structured_outputs=so) for _, so in cases]
    outputs = llm.generate([prompt for prompt, _ in cases], params, use_tqdm=False)
    for (_, so), output in zip(cases, outputs, strict=True):
        completion = output.outputs[0]
        assert completion.finish_reason == "stop", completion.text
        if so.json is not None:
            jsonschema.validate(json.loads(completion.text), so.json)
        elif so.regex is not None:
            assert re.fullmatch(so.regex, completion.text), completion.text
        else:
            assert completion.text in so.choice
        assert output.timing.grammar_compile_time is not None
