"""Prompt files inside `mixture:` (workloads.text_mixtures): text kept, lengths from the tokenizer, classes kept or
named by the component, refused by workloads.load, checked SLO classes and `bench workloads show`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import workloads
from engine.tokenizer import get_tokenizer
from sweep.point.prompts import check_slo_classes
from sweep.point.runner import WorkloadConfig
from workloads import commands
from workloads.text_mixtures import check_text_mixture, is_text_mixture, mixture_classes, parse_components
from workloads.text_workloads import text_prompts

TOKENIZER = get_tokenizer("tiny-random")
ROWS = [
    {"prompt": "What is the capital of Peru?", "output_len": 12, "class": "interactive"},
    {"prompt": "Name three rivers.", "output_len": 30},
    {"prompt": "Explain tides briefly.", "output_len": 7},
]


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _short_trace(path: Path) -> Path:
    """A length trace of short requests (synthesized fast)."""
    return _write(path, [{"input_len": 16 + i, "output_len": 4} for i in range(5)])


def _raw_len(text: str) -> int:
    return len(TOKENIZER(text, add_special_tokens=True)["input_ids"])


def test_components_tell_prompt_files_from_length_sources(tmp_path: Path) -> None:
    chat = _write(tmp_path / "chat.jsonl", ROWS)
    trace = _write(tmp_path / "trace.jsonl", [{"input_len": 10, "output_len": 5}])
    spec = f"prompts:{chat}=3,{chat}=1,{trace}=1,fixed,servelab-prompts=2"
    assert [(c.text, c.name, c.weight) for c in parse_components(spec)] == [
        (True, "chat", 3.0), (True, "chat", 1.0), (False, "trace", 1.0), (False, "fixed", 1.0),
        (True, "servelab-prompts", 2.0),
    ]  # fmt: skip
    assert is_text_mixture(f"mixture:{chat}=1,fixed=1") and workloads.is_text_workload(f"mixture:{chat}=1,fixed=1")
    assert not is_text_mixture(f"mixture:{trace}=1,fixed=1") and not is_text_mixture("fixed")
    with pytest.raises(ValueError, match="mixes in a prompt file"):
        workloads.load(f"mixture:prompts:{chat}=1,fixed=1")
    assert len(workloads.load(f"mixture:{trace}=1,fixed=1", num_requests=10)) == 10  # a length mixture as before


def test_mixture_keeps_the_text_classes_and_measured_lengths(tmp_path: Path) -> None:
    chat, trace = _write(tmp_path / "chat.jsonl", ROWS), _short_trace(tmp_path / "short.jsonl")
    name = f"mixture:prompts:{chat}=1,{trace}=1"
    specs, prompts = text_prompts(name, "completions", None, TOKENIZER, 80, 3, "")
    assert len(specs) == len(prompts) == 80
    texts = {row["prompt"]: row for row in ROWS}
    pairs = list(zip(specs, prompts, strict=True))
    from_file = [(s, p) for s, p in pairs if re.sub(r"^\[r\d+\] ", "", p.prompt) in texts]
    synthesized = [(s, p) for s, p in pairs if (s, p) not in from_file]
    assert 25 <= len(from_file) <= 55  # weights 1:1
    for spec, prompt in from_file:  # n > rows: every row repeated, its copies marked `[r<k>] `
        row = texts[re.sub(r"^\[r\d+\] ", "", prompt.prompt)]
        assert spec.output_len == row["output_len"] and spec.input_len == prompt.input_len == _raw_len(prompt.prompt)
        assert spec.request_class == prompt.request_class == row.get("class", "chat")
    trace_lengths = {spec.input_len for spec in workloads.load(str(trace))}
    for spec, prompt in synthesized:
        assert spec.input_len in trace_lengths and spec.output_len == 4
        assert spec.request_class == prompt.request_class == "short" and prompt.input_len == spec.input_len
    again = text_prompts(name, "completions", None, TOKENIZER, 80, 3, "")[1]
    assert [p.prompt for p in again] == [p.prompt for p in prompts]  # seeded


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("prompts:{dir}/missing.jsonl=1,fixed=1", "no such prompt file"),
        ("prompts:{chat}=x,fixed=1", "weight 'x' is not a number"),
        ("prompts:{chat}=-1,fixed=1", "mixture weights must be >= 0"),
        ("prompts:{chat}=1,nope=1", "mixture component 'nope'"),
    ],
)
def test_bad_mixtures_are_clear_errors(tmp_path: Path, spec: str, message: str) -> None:
    chat = _write(tmp_path / "chat.jsonl", ROWS)
    name = "mixture:" + spec.format(dir=tmp_path, chat=chat)
    with pytest.raises(ValueError, match=message):
        check_text_mixture(name)
    with pytest.raises(ValueError, match=message):  # the sweep's one-request check, whichever component it draws
        text_prompts(name, "completions", None, TOKENIZER, 1, 0, "check")


def test_chat_rows_need_the_chat_endpoint_and_slo_classes_are_checked(tmp_path: Path) -> None:
    chats = _write(tmp_path / "chats.jsonl", [{"messages": [{"role": "user", "content": "Hi there"}]}])
    name = f"mixture:{chats}=1,random=1"
    with pytest.raises(ValueError, match="send this file with --endpoint chat"):
        text_prompts(name, "completions", None, TOKENIZER, 20, 0, "")
    _, prompts = text_prompts(name, "chat", 9, TOKENIZER, 20, 0, "")
    assert all(p.messages for p in prompts) and {p.request_class for p in prompts} == {"chats", "random"}
    assert mixture_classes(name) == ["chats", "random"]
    workload = WorkloadConfig(workload=name, endpoint="chat")
    check_slo_classes(workload, {"chats:ttft_ms": 500.0}, 20)
    with pytest.raises(ValueError, match=r"unknown class\(es\) \['batch'\].*\['chats', 'random'\]"):
        check_slo_classes(workload, {"batch:ttft_ms": 500.0}, 20)


def test_show_measures_a_mixture_with_a_prompt_file(tmp_path: Path) -> None:
    chat, trace = _write(tmp_path / "chat.jsonl", ROWS), _short_trace(tmp_path / "short.jsonl")
    app = typer.Typer()
    commands.register(app, get_tokenizer=get_tokenizer)
    runner = CliRunner()
    name = f"mixture:prompts:{chat}=1,{trace}=1"
    result = runner.invoke(app, ["workloads", "show", name, "--tokenizer", "tiny-random", "--compare", "lmsys"],
                           env={"COLUMNS": "200"})  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "count: 1000" in result.output and "mixed with length components" in result.output
    assert "classes: chat " in result.output and "short " in result.output and "interactive " in result.output
    assert "lmsys:" in result.output and "completions endpoint" in result.output
    result = runner.invoke(app, ["workloads", "show", f"mixture:prompts:{tmp_path}/none.jsonl=1,fixed=1"],
                           env={"COLUMNS": "200"})  # fmt: skip
    assert result.exit_code == 2 and "no such prompt file" in " ".join(result.output.split())  # wrapped at 200


def test_a_sweep_point_and_bench_simulate_send_the_mixture(tmp_path: Path) -> None:
    from sweep.point.prompts import build_prompts
    from sweep.run.results import load_results
    from sweep.simulate.simulation import SimulateConfig, load_profile, run_simulation

    chat, trace = _write(tmp_path / "chat.jsonl", ROWS), _short_trace(tmp_path / "short.jsonl")
    _, requests, _ = build_prompts(WorkloadConfig(workload=f"mixture:{chat}=1,{trace}=1"), TOKENIZER, 12, "salt7")
    assert len(requests) == 12 and {r.request_class for r in requests} <= {"chat", "interactive", "short"}
    assert all(r.prompt.startswith("[salt7] ") for r in requests if r.request_class != "short")
    chats = _write(tmp_path / "chats.jsonl", [{"messages": [{"role": "user", "content": "Hi"}], "output_len": 3}])
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({
        "kind": "servelab-step-profile", "knobs": {"model": "tiny-random", "dtype": "float32"},
        "kv_cache": {"tokens": 8192}, "cost_model": {"coefficients": {"overhead": 0.01, "tokens": 0.001}},
    }))  # fmt: skip
    workload = WorkloadConfig(workload=f"mixture:{chats}=1,{trace}=1")
    config = SimulateConfig(output_dir=tmp_path / "run", profile=load_profile(profile), values=[2],
                            engine_knobs={"max_num_seqs": 2, "max_model_len": 512}, workload=workload,
                            num_prompts=8)  # fmt: skip
    run = load_results(run_simulation(config))  # chats in the mixture: measured as the chat endpoint sends them
    assert (run.points["completed"] == 8).all() and set(run.requests["request_class"]) <= {"chats", "short"}
