"""Structured outputs with the default model behind `bench serve`, started with the server-wide
`--structured-outputs-config '{"disable_any_whitespace": true}'`: the openai SDK in all three request shapes, bad specs
answered 400 while the server keeps serving, and `bench sweep` judging every output valid on JSON schemas, regexes
and choices. (Without the compact default the 135M model writes `{ \n` and then newlines until max_tokens.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import openai
import pytest
from serve_helpers import API_KEY, REPO, LiveServer, post, start_server

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
ORDER = {
    "type": "object",
    "properties": {
        "order_id": {"type": "integer", "minimum": 1000, "maximum": 9999},
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"sku": {"enum": ["ABC", "XYZ"]}, "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
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
PHONE = r"\(\d{3}\) \d{3}-\d{4}"
COMPACT = json.dumps({"disable_any_whitespace": True})


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    live = start_server("--api-key", API_KEY, "--structured-outputs-config", COMPACT, model=MODEL)
    yield live
    live.stop()


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=900)


def ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_the_three_request_shapes_through_the_openai_sdk(client: openai.OpenAI, server: LiveServer) -> None:
    response_format = {"type": "json_schema", "json_schema": {"name": "order", "schema": ORDER, "strict": True}}
    chat = client.chat.completions.create(
        model=MODEL, messages=ask("An example order as JSON."), temperature=0, max_tokens=120,
        response_format=response_format,  # type: ignore[arg-type]
    )  # fmt: skip
    jsonschema.validate(json.loads(chat.choices[0].message.content or ""), ORDER)
    timing = chat.model_extra["servelab"]  # type: ignore[index]
    assert timing["grammar_compile_time"] is not None and timing["grammar_bitmask_time_per_step"] > 0

    anything = client.chat.completions.create(
        model=MODEL, messages=ask('Reply with exactly this JSON object: {"ok": true}'), temperature=0, max_tokens=120,
        response_format={"type": "json_object"},
    )  # fmt: skip
    assert anything.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(anything.choices[0].message.content or ""), dict)

    phone = client.completions.create(
        model=MODEL,
        prompt="Call us at",
        temperature=0,
        max_tokens=30,
        extra_body={"structured_outputs": {"regex": PHONE}},
    )
    assert re.fullmatch(PHONE, phone.choices[0].text), phone.choices[0].text

    stream = client.chat.completions.create(
        model=MODEL, messages=ask("Is water wet?"), temperature=0, max_tokens=10, stream=True,
        extra_body={"guided_choice": ["yes", "no"]},
    )  # fmt: skip
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices) in ("yes", "no")

    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as response:
        metrics = response.read().decode()
    count = re.search(r"^servelab:request_grammar_compile_time_seconds_count\{[^}]*\} (\S+)$", metrics, re.M)
    assert count and float(count.group(1)) >= 4


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"structured_outputs": {"regex": "[0-9"}}, "structured_outputs", "invalid regex for structured outputs"),
        ({"guided_json": {"type": "object", "properties": {"a": {"type": "strin"}}}}, "guided_json", "strin"),
        ({"guided_grammar": "root ::= item"}, "guided_grammar", 'Rule "item" is not defined'),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}},
            "response_format",
            "bogus",
        ),  # fmt: skip
    ],
)
def test_bad_specs_are_400_and_the_server_keeps_serving(
    server: LiveServer, body: dict, param: str, message: str
) -> None:
    status, answer = post(server.url + "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 4, **body})
    assert status == 400 and answer["error"]["param"] == param and message in answer["error"]["message"]
    status, answer = post(server.url + "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2})
    assert status == 200 and answer["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("kind", ["json", "regex", "choice"])
def test_bench_sweep_finds_every_output_valid(server: LiveServer, tmp_path: Path, kind: str) -> None:
    out = tmp_path / "run"
    command = [sys.executable, "-m", "cli", "sweep", "--url", server.url + "/v1", "--api-key", API_KEY,
               "--model", MODEL, "--endpoint", "chat", "--structured-output", kind, "--input-len", "24",
               "--output-len", "48", "--concurrency", "2", "--num-prompts", "4",
               "--temperature", "0", "--slo", "valid=1", "--output-dir", str(out), "--no-report"]  # fmt: skip
    subprocess.run(command, cwd=REPO, check=True, capture_output=True, timeout=900)
    points = [json.loads(path.read_text()) for path in (out / "points").glob("*.json")]
    assert points and all(p["completed"] == 4 and p["valid_output_fraction"] == 1.0 for p in points), points
    assert all(p["slo_attainment"] == 1.0 for p in points)
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert [row["output_valid"] for row in rows] == [True] * 4
