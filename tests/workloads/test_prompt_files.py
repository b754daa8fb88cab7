"""Prompt-file workloads (workloads.prompt_files): each format, errors by file and line, lengths from the tokenizer,
sampling, the shipped prompt set and `bench workloads show`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import workloads
from engine.tokenizer import get_tokenizer
from workloads import commands
from workloads.prompt_files import (
    DEFAULT_OUTPUT_LEN,
    prompt_file_prompts,
    read_prompt_file,
    sample_rows,
    shipped_prompt_sets,
)
from workloads.spec import WorkloadFormatError

TOKENIZER = get_tokenizer("tiny-random")


def write_jsonl(path: Path, rows: list) -> str:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return f"prompts:{path}"


def raw_len(text: str) -> int:
    return len(TOKENIZER(text, add_special_tokens=True)["input_ids"])


def chat_len(messages: list[dict]) -> int:
    rendered = TOKENIZER.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return len(TOKENIZER(rendered, add_special_tokens=False)["input_ids"])


def test_jsonl_prompts_and_vllm_custom_layout_keep_text_and_count_tokens(tmp_path: Path) -> None:
    name = write_jsonl(
        tmp_path / "p.jsonl",
        [
            {"prompt": "What is the capital of Peru?", "output_len": 12},
            {"prompt": "Name three rivers.", "max_tokens": 30},
            {"prompt": "Explain tides briefly.", "output_tokens": 7},  # vLLM --dataset-name custom
            {"prompt": "No length here."},
        ],
    )
    specs, prompts = prompt_file_prompts(name, "completions", None, TOKENIZER, None, 0)
    assert [p.prompt for p in prompts] == [
        "What is the capital of Peru?",
        "Name three rivers.",
        "Explain tides briefly.",
        "No length here.",
    ]
    assert [s.output_len for s in specs] == [12, 30, 7, DEFAULT_OUTPUT_LEN]
    assert [s.input_len for s in specs] == [raw_len(p.prompt) for p in prompts] == [p.input_len for p in prompts]
    specs, _ = prompt_file_prompts(name, "completions", 50, TOKENIZER, None, 0)
    assert [s.output_len for s in specs] == [12, 30, 7, 50]  # --output-len fills only the missing length


def test_chat_rows_and_the_chat_endpoint(tmp_path: Path) -> None:
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why is snow white?"}]
    name = write_jsonl(tmp_path / "c.jsonl", [{"messages": chat, "output_len": 9}, {"prompt": "Hello there."}])
    specs, prompts = prompt_file_prompts(name, "chat", None, TOKENIZER, None, 0, salt="s1")
    assert prompts[0].messages == [chat[0], {"role": "user", "content": "[s1] Why is snow white?"}]
    assert prompts[1].messages == [{"role": "user", "content": "[s1] Hello there."}]
    assert [s.input_len for s in specs] == [chat_len(p.messages) for p in prompts]
    assert specs[0].output_len == 9
    with pytest.raises(WorkloadFormatError, match=r"c\.jsonl: line 1: is a chat.*--endpoint chat"):
        prompt_file_prompts(name, "completions", None, TOKENIZER, 1, 0)


def test_sharegpt_first_human_turn_and_reply_length(tmp_path: Path) -> None:
    reply = "Because the water droplets scatter all colours of light about equally."
    entries = [
        {
            "id": "a",
            "conversations": [{"from": "human", "value": "Why are clouds white?"}, {"from": "gpt", "value": reply}],
        },
        {"id": "b", "conversations": []},  # skipped, as downloads have such entries
        {"id": "c", "conversations": [{"from": "human", "value": "Only a question."}]},
    ]
    path = tmp_path / "share.json"
    path.write_text(json.dumps(entries, indent=1))
    name = f"prompts:{path}"
    data = read_prompt_file(name)
    lines = path.read_text().splitlines()
    starts = [lines.index(f'  "id": "{key}",') for key in "ac"]  # 0-based line of each id: its entry starts above
    assert data.skipped == 1 and [row.line for row in data.rows] == starts  # the line each entry starts on
    specs, prompts = prompt_file_prompts(name, "completions", None, TOKENIZER, None, 0)
    assert [p.prompt for p in prompts] == ["Why are clouds white?", "Only a question."]
    assert specs[0].output_len == len(TOKENIZER(reply, add_special_tokens=False)["input_ids"])
    assert specs[1].output_len == DEFAULT_OUTPUT_LEN and specs[0].input_len == raw_len("Why are clouds white?")
    one_line = write_jsonl(tmp_path / "share.jsonl", [entries[0]])  # ShareGPT entries as JSONL lines too
    assert prompt_file_prompts(one_line, "completions", None, TOKENIZER, None, 0)[0] == specs[:1]


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (['{"prompt": "fine"}', '{"prompt": "broken'], r"bad\.jsonl: line 2: invalid JSON"),
        (['{"prompt": "fine"}', "", '{"text": "x"}'], r"bad\.jsonl: line 3: no prompt: needs 'prompt'"),
        (['{"prompt": ""}'], r"line 1: 'prompt' must be a non-empty string"),
        (['{"prompt": "x", "output_len": 0}'], r"line 1: output_len is 0"),
        (['{"prompt": "x", "max_tokens": "lots"}'], r"line 1: max_tokens is 'lots'"),
        (['{"messages": [{"role": "robot", "content": "x"}]}'], r"line 1: messages\[1\] needs a role"),
        (['{"messages": [{"role": "system", "content": "x"}]}'], r"line 1: 'messages' has no user message"),
        (["[1, 2]"], r"line 1: expected a JSON object"),
        ([], r"bad\.jsonl: no prompts in the file \(it is empty\)"),
    ],
)
def test_bad_files_name_the_file_and_line(tmp_path: Path, rows: list[str], message: str) -> None:
    name = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(WorkloadFormatError, match=message):
        prompt_file_prompts(name, "completions", None, TOKENIZER, 1, 0)


def test_bad_json_lists_and_missing_files(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('[\n {"prompt": "a"},\n {"prompt": "b",}\n]')
    with pytest.raises(WorkloadFormatError, match=r"bad\.json: line 3: invalid JSON"):
        read_prompt_file(f"prompts:{path}")
    path.write_text('[\n {"conversations": "no"}\n]')
    with pytest.raises(WorkloadFormatError, match=r"line 2: 'conversations' must be a list"):
        read_prompt_file(f"prompts:{path}")
    with pytest.raises(FileNotFoundError, match="no such prompt file"):
        read_prompt_file(f"prompts:{tmp_path / 'nope.jsonl'}")
    with pytest.raises(ValueError, match="prompt-text workload"):
        workloads.load(f"prompts:{path}")


def test_sampling_subsets_and_repeats_marked() -> None:
    assert sample_rows(5, None, 0) == [(i, 0) for i in range(5)]
    subset = sample_rows(10, 4, 3)
    assert len({i for i, _ in subset}) == 4 and subset == sorted(subset) and subset == sample_rows(10, 4, 3)
    assert subset != sample_rows(10, 4, 4)
    repeated = sample_rows(3, 7, 0)
    assert [copy for _, copy in repeated] == [0, 0, 0, 1, 1, 1, 2]
    assert sorted(i for i, copy in repeated if copy < 2) == [0, 0, 1, 1, 2, 2]
    specs, prompts = prompt_file_prompts("servelab-prompts", "completions", None, TOKENIZER, 70, 0, salt="x")
    rows = read_prompt_file("servelab-prompts").rows
    again = sample_rows(len(rows), 70, 0)[64][0]  # the first row drawn for the second pass
    assert prompts[0].prompt == f"[x] {rows[0].prompt}" and prompts[64].prompt == f"[x] [r1] {rows[again].prompt}"


def test_the_shipped_prompt_set_is_a_workload_with_provenance() -> None:
    assert "servelab-prompts" in shipped_prompt_sets() and workloads.is_text_workload("servelab-prompts")
    data = read_prompt_file("servelab-prompts")
    assert 48 <= len(data.rows) <= 96 and data.skipped == 0 and not data.has_chats
    assert len({row.prompt for row in data.rows}) == len(data.rows)
    assert all(row.output_len is not None for row in data.rows)
    sources = (workloads.prompt_files.DATA_DIR / "SOURCES.md").read_text()
    assert "servelab-prompts.jsonl" in sources and "written for servelab" in sources and "CC0" in sources


def test_show_reports_measured_lengths_beside_a_shipped_mix(tmp_path: Path) -> None:
    app = typer.Typer()
    commands.register(app, get_tokenizer=get_tokenizer)
    runner = CliRunner()
    name = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "one two three", "output_len": 5}, {"prompt": "four"}])
    result = runner.invoke(
        app, ["workloads", "show", name, "--tokenizer", "tiny-random", "--compare", "lmsys"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    lengths = sorted([raw_len("one two three"), raw_len("four")])
    assert "count: 2" in result.output and f"min {lengths[0]}" in result.output and f"max {lengths[1]}" in result.output
    assert "lmsys:" in result.output and "KS statistic" in result.output and "completions endpoint" in result.output
    bad = write_jsonl(tmp_path / "bad.jsonl", ['{"prompt": "ok"}', "{oops"])
    result = runner.invoke(app, ["workloads", "show", bad, "--tokenizer", "tiny-random"], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and "bad.jsonl: line 2: invalid JSON" in result.output
    result = runner.invoke(app, ["workloads", "show", name, "--compare", "nope"], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and "not a shipped mix" in result.output
