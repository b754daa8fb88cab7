"""Conversation files in the real formats (tiny hand-written samples shaped like ShareGPT's
`ShareGPT_V3_unfiltered_cleaned_split.json` and LMSYS-Chat-1M's rows): parsing, normalising, turns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workloads import WorkloadFormatError
from workloads.conversations import conversation_turns, load_conversations

SHAREGPT = [
    {
        "id": "QWJhYvA_0",
        "conversations": [
            {"from": "human", "value": "What is a KV cache?"},
            {"from": "gpt", "value": "It stores attention keys and values of earlier tokens."},
            {"from": "human", "value": "Why does it help?"},
            {"from": "gpt", "value": "Each new token attends to them without recomputing them."},
            {"from": "human", "value": "Thanks!"},  # no reply: not a turn
        ],
    },
    {
        "id": "opener_gpt",
        "conversations": [
            {"from": "gpt", "value": "Hi!"},
            {"from": "human", "value": "Hello"},
            {"from": "gpt", "value": "How can I help?"},
        ],
    },
    {
        "id": "broken",
        "conversations": [
            {"from": "human", "value": "a"},
            {"from": "gpt", "value": "b"},
            {"from": "gpt", "value": "c"},
            {"from": "human", "value": "d"},
        ],
    },
    {"id": "single", "conversations": [{"from": "human", "value": "only a question"}]},
]
LMSYS = {
    "conversation_id": "33f01939a744455c869cb234afca47f1",
    "model": "vicuna-13b",
    "conversation": [
        {"content": "how can identity protection services help protect me against identity theft", "role": "user"},
        {"content": "Identity protection services can help by monitoring your credit reports.", "role": "assistant"},
    ],
    "turn": 1,
    "language": "English",
}


def test_sharegpt_json_and_lmsys_jsonl(tmp_path: Path) -> None:
    sharegpt = tmp_path / "sharegpt.json"
    sharegpt.write_text(json.dumps(SHAREGPT))
    parsed = load_conversations(sharegpt)
    assert [c.id for c in parsed.conversations] == ["QWJhYvA_0", "opener_gpt", "broken"]
    assert [c.turns for c in parsed.conversations] == [2, 1, 1]  # the unanswered last question is dropped
    assert parsed.skipped == 1  # "single" has no reply
    assert parsed.conversations[1].messages[0] == {"role": "user", "content": "Hello"}  # the assistant opener goes
    assert [m["content"] for m in parsed.conversations[2].messages] == ["a", "b"]  # cut at the break
    lmsys = tmp_path / "lmsys.jsonl"
    lmsys.write_text(json.dumps(LMSYS) + "\n\n" + json.dumps({"messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"}]}) + "\n")  # fmt: skip
    rows = load_conversations(lmsys).conversations
    assert rows[0].id == LMSYS["conversation_id"] and rows[0].turns == 1
    assert rows[1].messages[0]["role"] == "system" and rows[1].turns == 1


def test_the_file_is_parsed_once(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(SHAREGPT))
    assert load_conversations(path) is load_conversations(str(path))


def test_malformed_files_name_the_row(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(LMSYS) + "\n" + json.dumps({"conversation": [{"role": "robot", "content": "x"}]}))
    with pytest.raises(WorkloadFormatError, match="row 2.*unknown role 'robot'"):
        load_conversations(path)
    path.write_text(json.dumps({"text": "no turns"}))
    with pytest.raises(WorkloadFormatError, match="row 1.*no 'conversations'"):
        load_conversations(path)
    path.write_text(json.dumps(LMSYS) + "\n\n" + '{"conversation": [')  # the same message as a prompt file's
    with pytest.raises(WorkloadFormatError, match=r"bad\.jsonl: line 3: invalid JSON: .* at column"):
        load_conversations(path)
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps(SHAREGPT[3:]))
    with pytest.raises(WorkloadFormatError, match="no conversation with a complete"):
        load_conversations(empty)


class WordTokenizer:
    """One token per word; the chat template writes `role: content` per message and `assistant:` after them."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [0] * len(text.split())

    def apply_chat_template(self, messages: list[dict], tokenize: bool, add_generation_prompt: bool) -> list[int]:
        text = " ".join(f"{m['role']}: {m['content']}" for m in messages) + " assistant:" * add_generation_prompt
        return self.encode(text)


def test_each_turn_carries_the_recorded_history(tmp_path: Path) -> None:
    tokenizer = WordTokenizer()
    path = tmp_path / "c.json"
    path.write_text(json.dumps(SHAREGPT[:1]))
    conversation = load_conversations(path).conversations[0]
    turns = conversation_turns(conversation, tokenizer, salt="run1-c0001-s0")
    assert len(turns) == 2
    assert turns[0].messages == [{"role": "user", "content": "[run1-c0001-s0] What is a KV cache?"}]
    assert turns[1].messages[1:] == [dict(m) for m in conversation.messages[1:3]]  # the recorded reply, then Q2
    reply = "Each new token attends to them without recomputing them."
    assert turns[1].output_len == len(tokenizer.encode(reply, add_special_tokens=False))
    assert (turns[0].input_len, turns[1].input_len) == (8, 7 + 10 + 5 + 1)  # words, the salt one of them
    fitted = conversation_turns(conversation, tokenizer, max_model_len=turns[0].input_len + turns[0].output_len)
    assert len(fitted) == 1  # the second turn does not fit: the session ends before it
