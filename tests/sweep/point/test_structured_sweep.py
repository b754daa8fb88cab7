"""The sweep's structured outputs: constraints, request shapes, the validator (checked against `jsonschema`), and
validity in the metrics, the SLO and the stored rows."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pandas as pd
import pytest

from reports.recompute import format_slo, normalize_slo, point_metrics, records_from_rows
from sweep.point.benchmark_metrics import calculate_metrics, is_good, parse_slo
from sweep.point.client import ClientConfig, PromptRequest, build_payload
from sweep.point.prompts import check_outputs
from sweep.point.records import RequestRecord
from workloads.structured import (
    Constraint,
    SchemaNotSupported,
    json_schema,
    make_constraint,
    max_output_chars,
    output_is_valid,
    schema_size,
    validate_json,
)

BOUNDED = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "minimum": 1, "maximum": 5},
        "x": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        "s": {"type": "string", "minLength": 2, "maxLength": 4, "pattern": "^[a-z]+$"},
        "e": {"enum": ["a", 1, True, None]},
        "c": {"const": {"k": [1, 2]}},
        "l": {"type": "array", "items": {"type": ["integer", "null"]}, "minItems": 1, "maxItems": 2},
        "o": {"type": "object", "additionalProperties": {"type": "boolean"}},
    },
    "required": ["n", "s"],
    "additionalProperties": False,
}


def sample_instance(schema: dict, rng: np.random.Generator) -> Any:
    """A valid instance of a workload schema (or BOUNDED), with random values."""
    if "enum" in schema:
        return schema["enum"][int(rng.integers(len(schema["enum"])))]
    if "const" in schema:
        return copy.deepcopy(schema["const"])
    kind = schema["type"] if isinstance(schema["type"], str) else schema["type"][0]
    if kind == "object":
        out = {k: sample_instance(v, rng) for k, v in schema.get("properties", {}).items()}
        if isinstance(schema.get("additionalProperties"), dict):
            out["extra"] = sample_instance(schema["additionalProperties"], rng)
        return out
    if kind == "array":
        return [sample_instance(schema["items"], rng) for _ in range(int(rng.integers(1, 3)))]
    if kind == "string":
        return "ab" if "pattern" in schema else "text"
    if kind == "integer":
        return int(rng.integers(schema.get("minimum", -5), schema.get("maximum", 5) + 1))
    if kind == "number":
        return 0.5
    if kind == "boolean":
        return bool(rng.integers(2))
    return None


def mutations(instance: Any) -> list[Any]:
    """Variants of an object instance that break one rule each (or none: validity is decided by jsonschema)."""
    out: list[Any] = [instance, [instance], "x", 3, None, True, 1.5]
    if isinstance(instance, dict):
        for key, value in instance.items():
            out.append({k: v for k, v in instance.items() if k != key})
            for bad in ("", "toolong", 0, 6, 1.0, 2.5, -1, [], [None], [1, 2, 3], {}, {"k": [1, 2]}, False, None, "A1"):
                out.append({**instance, key: bad})
            if isinstance(value, dict):
                out += [{**instance, key: variant} for variant in mutations(value)[:12]]
        out.append({**instance, "unexpected": 1})
    return out


def test_the_validator_agrees_with_jsonschema() -> None:
    rng = np.random.default_rng(7)
    schemas = [BOUNDED] + [json_schema(int(n), rng) for n in (1, 2, 4, 8, 16)]
    checked = invalid = 0
    for schema in schemas:
        reference = jsonschema.Draft202012Validator(schema)
        for instance in mutations(sample_instance(schema, rng)):
            expected = reference.is_valid(instance)
            assert validate_json(instance, schema) == expected, (schema, instance)
            checked += 1
            invalid += not expected
    assert checked > 500 and 0 < invalid < checked


def test_constraints_and_their_request_shapes() -> None:
    schema = json_schema(2, np.random.default_rng(0))
    assert make_constraint(0, None, None, None, 0) is None
    workload = make_constraint(0, schema, None, None, 0)
    assert workload == Constraint("json", schema, "response_format")
    assert workload.request_fields() == {
        "response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": schema, "strict": True}}
    }
    generated = make_constraint(3, None, "json", "guided", 0)
    assert generated.kind == "json" and generated.request_fields() == {"guided_json": generated.spec}
    assert generated == make_constraint(3, None, "json", "guided", 0)  # reproducible per seed and index
    regex = make_constraint(1, None, "regex", None, 0)
    assert regex.request_fields() == {"structured_outputs": {"regex": regex.spec}}
    choice = make_constraint(2, None, "choice", "guided", 0)
    assert choice.request_fields() == {"guided_choice": choice.spec}
    with pytest.raises(ValueError, match="response_format carries JSON schemas only"):
        make_constraint(0, None, "regex", "response_format", 0)
    with pytest.raises(ValueError, match="must be one of"):
        make_constraint(0, None, "xml", None, 0)
    with pytest.raises(ValueError, match="shape must be one of"):
        make_constraint(0, None, "json", "body", 0)
    with pytest.raises(SchemaNotSupported, match="oneOf"):
        make_constraint(0, {"type": "object", "properties": {"a": {"oneOf": []}}}, None, None, 0)


@pytest.mark.parametrize("output_len", [16, 32, 128, 512])
def test_generated_schemas_are_bounded_and_fit_the_output_length(output_len: int) -> None:
    for index in range(60):
        spec = make_constraint(index, None, "json", None, 0, output_len=output_len).spec
        assert max_output_chars(spec) + 1 <= output_len  # the longest compact output and EOS, a token per character
    larger = {schema_size(make_constraint(i, None, "json", None, 0, output_len=512).spec) for i in range(60)}
    assert max(larger) > 4  # a longer output length allows larger schemas


def test_a_request_too_short_for_any_schema_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"request 2's output length \(8 tokens\) is too short .* raise --output-len"):
        make_constraint(2, None, "json", None, 0, output_len=8)


def test_a_constrained_payload_carries_its_fields_and_lets_the_grammar_end_it() -> None:
    config = ClientConfig(url="http://x/v1", model="m", endpoint="chat", ignore_eos=True)
    constraint = Constraint("regex", "[a-z]+", "structured_outputs")
    constrained = build_payload(config, PromptRequest(0, "p", None, 4, 8, constraint=constraint))
    plain = build_payload(config, PromptRequest(1, "p", None, 4, 8))
    assert constrained["structured_outputs"] == {"regex": "[a-z]+"} and "ignore_eos" not in constrained
    assert plain["ignore_eos"] is True and "structured_outputs" not in plain


def test_outputs_are_judged_per_kind() -> None:
    assert output_is_valid(Constraint("regex", "[0-9]{3}"), "123")
    assert not output_is_valid(Constraint("regex", "[0-9]{3}"), "1234")
    assert output_is_valid(Constraint("choice", ["yes", "no"]), "no")
    assert not output_is_valid(Constraint("choice", ["yes", "no"]), "no ")
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert output_is_valid(Constraint("json", schema), '{"a": 3}')
    assert not output_is_valid(Constraint("json", schema), '{"a": 3')  # does not parse
    assert not output_is_valid(Constraint("json", schema), '{"b": 3}')  # parses, does not validate


def record(index: int, valid: bool | None, success: bool = True, text: str = "") -> RequestRecord:
    r = RequestRecord(index, 4, 3, 0.0, send_time=0.0, success=success, first_token_time=0.1, last_token_time=0.3,
                      end_time=0.3, chunk_times=[0.1, 0.2, 0.3], chunk_tokens=[1, 1, 1], prompt_tokens=4,
                      output_tokens=3, output_valid=valid, generated_text=text)  # fmt: skip
    return r


def test_validity_in_metrics_slo_and_stored_rows() -> None:
    prompts = {i: PromptRequest(i, "p", None, 4, 3, constraint=Constraint("choice", ["a"])) for i in range(3)}
    prompts[3] = PromptRequest(3, "p", None, 4, 3)
    records = [record(0, None, text="a"), record(1, None, text="b"), record(2, None, success=False, text="a"),
               record(3, None, text="zzz")]  # fmt: skip
    check_outputs(records, prompts)
    assert [r.output_valid for r in records] == [True, False, None, None]
    slo = parse_slo("ttft=500,valid=1")
    assert slo == {"ttft_ms": 500.0, "valid": 1.0} and parse_slo("valid=0") is None
    with pytest.raises(ValueError, match="valid=1"):
        parse_slo("valid=2")
    assert [is_good(r, slo) for r in records] == [True, False, False, True]
    assert [is_good(r, {"ttft_ms": 500.0}) for r in records] == [True, True, False, True]
    metrics = calculate_metrics(records, duration=2.0, slo=slo)
    assert metrics["valid_output_fraction"] == 0.5  # of the completed constrained requests
    assert metrics["request_goodput"] == 1.0 and metrics["slo_attainment"] == 0.5
    assert "valid_output_fraction" not in calculate_metrics([record(0, None)], duration=1.0)
    rows = pd.DataFrame([r.to_row("c1") for r in records])
    assert [r.output_valid for r in records_from_rows(rows)] == [True, False, None, None]
    assert point_metrics(rows, 2.0, slo=slo)["request_goodput"] == metrics["request_goodput"]
    assert (
        normalize_slo({"ttft": 500, "valid": 1}) == slo and format_slo(slo) == "TTFT <= 500 ms, valid structured output"
    )
    assert json.loads(json.dumps(rows.to_dict("records")))[0]["output_valid"] is True


def test_a_sweep_stores_each_verdict_and_the_fraction(tmp_path: Path) -> None:
    """Plumbing through runner, results and report against the mock (whose words never satisfy a schema)."""
    from reports.importers import load_run
    from reports.tables import point_table
    from sweep.mock.calibrate import start_mock
    from sweep.point.runner import WorkloadConfig
    from sweep.run.sweeper import SweepConfig, run_sweep

    workload = WorkloadConfig(workload="structured", input_len=24, output_len=6, seed=1)
    with start_mock(1.0, 0.5, tmp_path / "mock.log") as mock:
        run_dir = run_sweep(
            SweepConfig(
                output_dir=tmp_path / "run",
                values=[2],
                url=mock.url,
                model="mock",
                tokenizer="tiny-random",
                workload=workload,
                num_prompts=4,
                slo={"ttft_ms": 10_000.0, "valid": 1.0},
                command="bench sweep (test)",
            )  # fmt: skip
        )
    rows = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    assert [row["output_valid"] for row in rows] == [False] * 4
    point = json.loads(next((run_dir / "points").glob("*.json")).read_text())
    assert point["valid_output_fraction"] == 0.0 and point["request_goodput"] == 0.0
    assert json.loads((run_dir / "config.json").read_text())["workload"]["structured_output"] is None
    assert point_table(load_run(run_dir))["valid outputs"].tolist() == [0.0]  # the report's table, next to goodput
