"""A prompt-file workload through a sweep point: the server receives the file's own text (after the point's salt),
and the records carry its token counts; a bad file fails at the sweep's pre-flight check."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from engine.tokenizer import get_tokenizer
from sweep.point.client import ClientConfig
from sweep.point.prompts import build_prompts, check_slo_classes
from sweep.point.runner import PointSpec, WorkloadConfig, run_point
from sweep.run.launcher import free_port
from workloads.spec import WorkloadFormatError

TEXTS = ["Why do cats purr?", "Summarise: the bus was late, so we walked home in the rain.", "Name a prime."]


def event(obj: dict | str) -> bytes:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()


@pytest.fixture
def recording_server() -> Iterator[tuple[str, list[dict]]]:
    """An OpenAI-style streaming server in a thread that keeps every request body it receives."""
    bodies: list[dict] = []
    loop = asyncio.new_event_loop()
    port = free_port()

    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        bodies.append(body)
        response = web.StreamResponse()
        await response.prepare(request)
        for _ in range(body.get("max_tokens") or body.get("max_completion_tokens")):
            await response.write(event({"choices": [{"index": 0, "text": " x", "delta": {"content": " x"}}]}))
        await response.write(event("[DONE]"))
        return response

    async def start() -> web.AppRunner:
        app = web.Application()
        app.router.add_post("/v1/completions", generate)
        app.router.add_post("/v1/chat/completions", generate)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        return runner

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runner = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield f"http://127.0.0.1:{port}/v1", bodies
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_a_point_sends_the_files_text(tmp_path: Path, recording_server: tuple[str, list[dict]], endpoint: str) -> None:
    url, bodies = recording_server
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": text, "output_len": 3}) + "\n" for text in TEXTS))
    tokenizer = get_tokenizer("tiny-random")
    workload = WorkloadConfig(workload=f"prompts:{path}", endpoint=endpoint)
    spec = PointSpec(label="c0002", mode="concurrency", concurrency=2, num_prompts=3)
    run = run_point(ClientConfig(url, "m", endpoint=endpoint), spec, workload, tokenizer, salt="run1")
    if endpoint == "chat":
        sent = [body["messages"][0]["content"] for body in bodies]
    else:
        sent = [body["prompt"] for body in bodies]
    assert sorted(sent) == sorted(f"[run1-c0002] {text}" for text in TEXTS)
    assert all((body.get("max_tokens") or body.get("max_completion_tokens")) == 3 for body in bodies)
    records = sorted(run.records, key=lambda r: r.index)
    assert all(r.success for r in records) and len(records) == 3
    for record, text in zip(records, TEXTS, strict=True):
        if endpoint == "chat":
            messages = [{"role": "user", "content": f"[run1-c0002] {text}"}]
            rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            expected = len(tokenizer(rendered, add_special_tokens=False)["input_ids"])
        else:
            expected = len(tokenizer(f"[run1-c0002] {text}", add_special_tokens=True)["input_ids"])
        assert record.requested_input_len == expected


def test_a_bad_file_fails_the_preflight_check_naming_its_line(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "fine"}\n{"prompt": "fine"}\n{"question": "no prompt"}\n')
    tokenizer = get_tokenizer("tiny-random")
    workload = WorkloadConfig(workload=f"prompts:{path}")
    with pytest.raises(WorkloadFormatError, match=r"prompts\.jsonl: line 3: no prompt"):
        build_prompts(workload, tokenizer, 1, salt="check")  # what the sweeper runs before anything is sent
    path.write_text('{"prompt": "fine"}\n')
    check_slo_classes(workload, {"ttft": 100.0}, 1, tokenizer)  # no class SLO: a text workload passes
