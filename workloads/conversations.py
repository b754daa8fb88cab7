"""Real multi-turn conversations for session workloads (`bench sweep --conversations FILE`).

Formats, as a JSON list or JSONL (one conversation per line), detected per conversation:
- ShareGPT: `{"id", "conversations": [{"from": "human" | "gpt" | "system", "value": text}, ...]}`;
- LMSYS-Chat-1M: `{"conversation_id", "conversation": [{"role": "user" | "assistant", "content": text}, ...]}`;
- OpenAI chat: `{"messages": [{"role", "content"}, ...]}`.

A conversation keeps a leading system message, skips assistant messages before the first user message, and ends
at the first break in the user/assistant alternation (ShareGPT has some) or at a user message with no reply: each
turn is a user message and its recorded reply. Conversations without a complete turn are skipped and counted.
The file is parsed once per process (cached by path, size and modification time).

Mooncake traces have no session or turn fields (only hash ids of shared prefix blocks), so their conversations
cannot be rebuilt; `--replay` of a Mooncake trace reproduces its prefix reuse through the hash ids instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from workloads.spec import WorkloadFormatError
from workloads.synthesis import chat_prompt_len

ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "assistant": "assistant",
    "system": "system",
}

FORMATS = (("conversations", "from", "value"), ("conversation", "role", "content"), ("messages", "role", "content"))


@dataclass(frozen=True, slots=True)
class Conversation:
    id: str
    messages: tuple[dict[str, str], ...]  # [system], user, assistant, user, assistant, ...

    @property
    def turns(self) -> int:
        return sum(m["role"] == "assistant" for m in self.messages)


@dataclass(frozen=True, slots=True)
class ConversationFile:
    conversations: tuple[Conversation, ...]
    skipped: int  # entries without a complete user -> assistant turn


@dataclass(slots=True)
class Turn:
    """One request of a session: the history and this turn's user message, and the recorded reply's length."""

    messages: list[dict[str, str]]
    input_len: int  # prompt tokens under the target's chat template
    output_len: int  # the recorded reply's tokens (target tokenizer), at least 1


def _messages(entry: Any, path: Path, row: int) -> list[dict[str, str]]:
    if not isinstance(entry, dict):
        raise WorkloadFormatError(path, row, f"expected a conversation object, got {type(entry).__name__}")
    fields = next((f for f in FORMATS if isinstance(entry.get(f[0]), list)), None)
    if fields is None:
        raise WorkloadFormatError(path, row, "no 'conversations' (ShareGPT), 'conversation' (LMSYS) or 'messages' list")
    key, role_key, text_key = fields
    messages = []
    for number, message in enumerate(entry[key], start=1):
        if not isinstance(message, dict) or not isinstance(message.get(text_key), str):
            raise WorkloadFormatError(path, row, f"{key}[{number}] needs a string {text_key!r}")
        role = ROLES.get(str(message.get(role_key)).lower())
        if role is None:
            raise WorkloadFormatError(path, row, f"{key}[{number}] has unknown role {message.get(role_key)!r}")
        messages.append({"role": role, "content": message[text_key]})
    return messages


def _normalise(messages: list[dict[str, str]]) -> tuple[dict[str, str], ...]:
    """[system], then strictly alternating user/assistant pairs, cut at the first break."""
    kept = [messages[0]] if messages and messages[0]["role"] == "system" else []
    rest = messages[len(kept) :]
    while rest and rest[0]["role"] != "user":
        rest = rest[1:]
    for position, message in enumerate(rest):
        if message["role"] != ("user" if position % 2 == 0 else "assistant"):
            break
        kept.append(message)
    if kept and kept[-1]["role"] != "assistant":
        kept.pop()  # a last question without its reply has no recorded length
    return tuple(kept)


def json_lines(text: str, path: Path) -> list[tuple[int, Any]]:
    """(line, entry) of each non-blank line of a JSONL text; a bad line is `FILE: line N: invalid JSON: ...`."""
    entries = []
    for line, content in enumerate(text.splitlines(), start=1):
        if content.strip():
            try:
                entries.append((line, json.loads(content)))
            except json.JSONDecodeError as error:
                problem = f"line {line}: invalid JSON: {error.msg} at column {error.colno}"
                raise WorkloadFormatError(path, None, problem) from None
    return entries


def _entries(path: Path) -> list[tuple[int, Any]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        return json_lines(text, path)
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise WorkloadFormatError(path, None, f"invalid JSON: {error.msg} at line {error.lineno}") from None
    if not isinstance(document, list):
        raise WorkloadFormatError(path, None, "expected a JSON list of conversations (or JSONL, one per line)")
    return list(enumerate(document, start=1))


@lru_cache(maxsize=4)
def _load(path: Path, size: int, mtime_ns: int) -> ConversationFile:
    conversations, skipped = [], 0
    for row, entry in _entries(path):
        messages = _normalise(_messages(entry, path, row))
        if not messages:
            skipped += 1
            continue
        name = entry.get("id") or entry.get("conversation_id") or f"row{row}"
        conversations.append(Conversation(str(name), messages))
    if not conversations:
        raise WorkloadFormatError(path, None, f"no conversation with a complete user -> assistant turn ({skipped})")
    return ConversationFile(tuple(conversations), skipped)


def load_conversations(path: str | Path) -> ConversationFile:
    """The file's conversations, parsed once per process."""
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such conversation file")
    stat = path.stat()
    return _load(path, stat.st_size, stat.st_mtime_ns)


def conversation_turns(
    conversation: Conversation, tokenizer: Any, salt: str = "", max_model_len: int | None = None
) -> list[Turn]:
    """The session's requests; turn k carries the recorded history (earlier questions and recorded replies).

    A non-empty `salt` starts the first user message (`[salt] `), so the same conversation sent in another point
    or session shares no prefix-cache blocks past the system prompt. With max_model_len the session ends before
    the first turn whose prompt plus reply does not fit."""
    messages = [dict(m) for m in conversation.messages]
    first_user = next(i for i, m in enumerate(messages) if m["role"] == "user")
    if salt:
        messages[first_user]["content"] = f"[{salt}] {messages[first_user]['content']}"
    turns = []
    for end, reply in enumerate(messages):
        if reply["role"] != "assistant":
            continue
        history = messages[:end]
        input_len = chat_prompt_len(tokenizer, history)
        output_len = max(1, len(tokenizer.encode(reply["content"], add_special_tokens=False)))
        if max_model_len is not None and input_len + output_len > max_model_len:
            break
        turns.append(Turn(history, input_len, output_len))
    return turns
