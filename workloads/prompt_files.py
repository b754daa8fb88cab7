"""Prompt-file workloads: real prompt text read from a file, sent as it is, lengths counted with the target's tokenizer.

`--workload prompts:FILE` reads FILE; `--workload NAME` reads a shipped prompt set, workloads/data/NAME.jsonl
(`shipped_prompt_sets()`; see workloads/data/SOURCES.md). Formats, detected per line or entry:
- JSONL, one object per line: `{"prompt": text}` or `{"messages": [{"role", "content"}, ...]}` (a chat), with an
  optional output length in `output_len`, `max_tokens` or `output_tokens`. vLLM's custom dataset (`vllm bench serve
  --dataset-name custom`: a `prompt` and an optional `output_tokens` per line) is this format.
- ShareGPT (a `.json` list, or JSONL with one entry per line): `{"conversations": [{"from": "human" | "gpt", "value":
  text}, ...]}`; the first human turn is the prompt and the reply after it gives the output length (its tokens with the
  target's tokenizer). Entries without a non-empty human turn are skipped and counted (downloads have some).
A `.json` file may also be a list of JSONL-style objects. Rows without an output length get the default
(`--output-len`, else DEFAULT_OUTPUT_LEN). Any entry may name its request class for per-class SLOs in `class` (or
`request_class`, `slo_class`: letters, digits, `_`, `.`, `-`), as a trace's rows do. Every bad entry is a
WorkloadFormatError naming the file and line.

Sampling n requests from R rows: n <= R draws a seeded subset without replacement, kept in file order; n > R sends
every row n // R times and a seeded subset for the rest. Copy k >= 1 of a row is marked `[r<k>] ` at its start so it
does not hit the prefix cache its first copy warmed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from workloads.conversations import ROLES, json_lines
from workloads.spec import RequestSpec, SynthesizedPrompt, WorkloadFormatError

PREFIX = "prompts:"
DATA_DIR = Path(__file__).parent / "data"
DEFAULT_OUTPUT_LEN = 128
OUTPUT_FIELDS = ("output_len", "max_tokens", "output_tokens")
CHAT_ROLES = ("system", "user", "assistant")
# ShareGPT speakers, as the conversation loader maps them: a human turn is the prompt, the next reply its length.
HUMAN = tuple(speaker for speaker, role in ROLES.items() if role == "user")
REPLY = tuple(speaker for speaker, role in ROLES.items() if role == "assistant")


@dataclass(frozen=True, slots=True)
class PromptText:
    """One row of a prompt file: a prompt or a chat, and its output length or recorded reply when the file has them."""

    line: int
    prompt: str | None = None
    messages: tuple[dict[str, str], ...] | None = None
    output_len: int | None = None
    reply: str | None = None  # ShareGPT: the recorded answer, measured for the output length
    request_class: str | None = None  # for per-class SLOs: the entry's `class` field


@dataclass(frozen=True, slots=True)
class PromptFile:
    path: Path
    rows: tuple[PromptText, ...]
    skipped: int  # ShareGPT entries without a human turn

    @property
    def has_chats(self) -> bool:
        return any(row.messages is not None for row in self.rows)

    @property
    def classes(self) -> list[str]:
        """The request classes the rows name, sorted."""
        return sorted({row.request_class for row in self.rows if row.request_class is not None})


def _error(path: Path, line: int, problem: str) -> WorkloadFormatError:
    """A bad entry, named by file and line: `FILE: line N: problem`."""
    return WorkloadFormatError(path, None, f"line {line}: {problem}")


def shipped_prompt_sets() -> list[str]:
    """Names of the prompt sets in workloads/data (NAME.jsonl)."""
    return sorted(path.stem for path in DATA_DIR.glob("*.jsonl"))


def is_prompt_workload(name: str) -> bool:
    return name.startswith(PREFIX) or name in shipped_prompt_sets()


def prompt_file_path(name: str) -> Path:
    """The file of `prompts:FILE` or of a shipped prompt set (also as `prompts:NAME` when no file NAME exists);
    FileNotFoundError naming it when it is missing."""
    if name in shipped_prompt_sets():
        return DATA_DIR / f"{name}.jsonl"
    if not name.startswith(PREFIX):
        raise ValueError(f"{name!r} is not a prompt workload: give prompts:FILE or one of {shipped_prompt_sets()}")
    path = Path(name[len(PREFIX) :]).expanduser()
    if not path.is_file() and name[len(PREFIX) :] in shipped_prompt_sets():
        return DATA_DIR / f"{name[len(PREFIX) :]}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such prompt file (from --workload {name})")
    return path


def _output_len(record: dict, path: Path, line: int) -> int | None:
    key = next((k for k in OUTPUT_FIELDS if record.get(k) is not None), None)
    if key is None:
        return None
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 1:
        raise _error(path, line, f"{key} is {value!r}, not a positive integer token count")
    return int(value)


def _chat(value: Any, path: Path, line: int) -> tuple[dict[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise _error(path, line, "'messages' must be a non-empty list of {role, content} objects")
    messages = []
    for number, message in enumerate(value, start=1):
        if not isinstance(message, dict) or message.get("role") not in CHAT_ROLES:
            raise _error(path, line, f"messages[{number}] needs a role in {CHAT_ROLES}")
        if not isinstance(message.get("content"), str) or not message["content"].strip():
            raise _error(path, line, f"messages[{number}] needs a non-empty string 'content'")
        messages.append({"role": message["role"], "content": message["content"]})
    if not any(m["role"] == "user" for m in messages):
        raise _error(path, line, "'messages' has no user message")
    return tuple(messages)


def _sharegpt(turns: Any, path: Path, line: int) -> PromptText | None:
    if not isinstance(turns, list):
        raise _error(path, line, "'conversations' must be a list of {from, value} turns")
    for position, turn in enumerate(turns):
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            raise _error(path, line, f"conversations[{position + 1}] needs a string 'value'")
        if str(turn.get("from")).lower() in HUMAN and turn["value"].strip():
            following = turns[position + 1] if position + 1 < len(turns) else None
            reply = None
            if isinstance(following, dict) and str(following.get("from")).lower() in REPLY:
                reply = following.get("value") if isinstance(following.get("value"), str) else None
            return PromptText(line, prompt=turn["value"], reply=reply)
    return None


def _request_class(record: dict, path: Path, line: int) -> str | None:
    from workloads.loaders import CLASS_ALIASES  # the trace loader's class fields, so both read the same ones

    key = next((k for k in CLASS_ALIASES if record.get(k) not in (None, "")), None)
    if key is None:
        return None
    value = str(record[key])
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", value):
        raise _error(path, line, f"{key} is {value!r}: a class is letters, digits, '_', '.' or '-'")
    return value


def parse_row(record: Any, path: Path, line: int) -> PromptText | None:
    """One entry as a PromptText (None: a ShareGPT entry with no human turn, skipped)."""
    if not isinstance(record, dict):
        raise _error(path, line, f"expected a JSON object, got {type(record).__name__}")
    row = _parse_text(record, path, line)
    request_class = _request_class(record, path, line)
    return row if row is None or request_class is None else replace(row, request_class=request_class)


def _parse_text(record: dict, path: Path, line: int) -> PromptText | None:
    if "conversations" in record:
        return _sharegpt(record["conversations"], path, line)
    output_len = _output_len(record, path, line)
    if "messages" in record:
        return PromptText(line, messages=_chat(record["messages"], path, line), output_len=output_len)
    if "prompt" not in record:
        raise _error(
            path, line, f"no prompt: needs 'prompt', 'messages' or 'conversations' (ShareGPT); found {sorted(record)}"
        )
    if not isinstance(record["prompt"], str) or not record["prompt"].strip():
        raise _error(path, line, f"'prompt' must be a non-empty string, got {str(record['prompt'])[:40]!r}")
    return PromptText(line, prompt=record["prompt"], output_len=output_len)


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position] in " \t\r\n":
        position += 1
    return position


def _json_list(text: str, path: Path) -> list[tuple[int, Any]]:
    """(line, entry) of a JSON list, each entry with the line it starts on."""
    decoder = json.JSONDecoder()
    position = _skip_space(text, 0)
    if not text.startswith("[", position):
        raise WorkloadFormatError(path, None, "expected a JSON list of prompts or ShareGPT conversations")
    entries: list[tuple[int, Any]] = []
    position, line, counted = _skip_space(text, position + 1), 1, 0
    while not text.startswith("]", position):
        line += text.count("\n", counted, position)
        counted = position
        try:
            entry, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError as error:
            raise _error(path, error.lineno, f"invalid JSON: {error.msg}") from None
        entries.append((line, entry))
        position = _skip_space(text, position)
        if text.startswith(",", position):
            position = _skip_space(text, position + 1)
        elif not text.startswith("]", position):
            bad_line = line + text.count("\n", counted, position)
            raise _error(path, bad_line, "invalid JSON: expected ',' or ']' after an entry")
    if text[position + 1 :].strip():
        raise WorkloadFormatError(path, None, "invalid JSON: text after the closing ']'")
    return entries


@lru_cache(maxsize=4)
def _read(path: Path, size: int, mtime_ns: int) -> PromptFile:
    text = path.read_text(encoding="utf-8")
    entries = _json_list(text, path) if path.suffix.lower() == ".json" else json_lines(text, path)
    rows, skipped = [], 0
    for line, entry in entries:
        row = parse_row(entry, path, line)
        if row is None:
            skipped += 1
        else:
            rows.append(row)
    if not rows:
        why = f" ({skipped} ShareGPT entries, none with a human turn)" if skipped else " (it is empty)"
        raise WorkloadFormatError(path, None, "no prompts in the file" + why)
    return PromptFile(path, tuple(rows), skipped)


def read_prompt_file(name: str) -> PromptFile:
    """Every row of the workload's file (`prompts:FILE` or a shipped set), parsed and checked once per process."""
    path = prompt_file_path(name).resolve()
    stat = path.stat()
    return _read(path, stat.st_size, stat.st_mtime_ns)


def sample_rows(count: int, n: int | None, seed: int) -> list[tuple[int, int]]:
    """(row index, copy number) of n draws from `count` rows (None: every row once), in file order per copy."""
    if n is None:
        return [(i, 0) for i in range(count)]
    if n < 1:
        raise ValueError(f"num_requests must be >= 1, got {n}")
    passes, rest = divmod(n, count)
    draws = [(i, copy) for copy in range(passes) for i in range(count)]
    extra = np.sort(np.random.default_rng(seed).choice(count, size=rest, replace=False))
    return draws + [(int(i), passes) for i in extra]


def _mark(text: str, salt: str, copy: int) -> str:
    marks = "".join(f"[{m}] " for m in (salt, f"r{copy}" if copy else "") if m)
    return marks + text


def prompt_file_prompts(
    name: str, endpoint: str, output_len: int | None, tokenizer: Any, n: int | None, seed: int, salt: str = ""
) -> tuple[list[RequestSpec], list[SynthesizedPrompt]]:
    """`n` requests of the prompt workload `name` for `endpoint` (completions | chat): the file's text after the salt
    (`[salt] `), input lengths counted as the server counts them (chat template included), output lengths from the
    file, else `output_len` (default DEFAULT_OUTPUT_LEN). A chat row on the completions endpoint is a ValueError."""
    data = read_prompt_file(name)
    if endpoint != "chat":
        chat = next((row for row in data.rows if row.messages is not None), None)
        if chat is not None:
            raise _error(data.path, chat.line, "is a chat ('messages'): send this file with --endpoint chat")
    default_len = output_len or DEFAULT_OUTPUT_LEN
    picked = [(data.rows[i], copy) for i, copy in sample_rows(len(data.rows), n, seed)]
    sent: list[tuple[str | None, list[dict] | None]] = []
    for row, copy in picked:
        if row.messages is not None:
            messages = [dict(m) for m in row.messages]
            first_user = next(i for i, m in enumerate(messages) if m["role"] == "user")
            messages[first_user]["content"] = _mark(messages[first_user]["content"], salt, copy)
            sent.append((None, messages))
        elif endpoint == "chat":
            sent.append((None, [{"role": "user", "content": _mark(row.prompt or "", salt, copy)}]))
        else:
            sent.append((_mark(row.prompt or "", salt, copy), None))
    input_lens = count_prompt_tokens(tokenizer, sent)
    replies = [row.reply for row, _ in picked if row.output_len is None and row.reply is not None]
    reply_lens = (
        iter(len(ids) for ids in tokenizer(replies, add_special_tokens=False)["input_ids"]) if replies else None
    )
    specs: list[RequestSpec] = []
    prompts: list[SynthesizedPrompt] = []
    for (row, _), (prompt, messages), input_len in zip(picked, sent, input_lens, strict=True):
        length = row.output_len
        if length is None:
            length = max(1, next(reply_lens)) if row.reply is not None and reply_lens is not None else default_len
        specs.append(RequestSpec(input_len=input_len, output_len=length, request_class=row.request_class))
        prompts.append(SynthesizedPrompt(prompt, messages, input_len, length, extra={"line": row.line},
                                         request_class=row.request_class))  # fmt: skip
    return specs, prompts


def count_prompt_tokens(tokenizer: Any, sent: list[tuple[str | None, list[dict] | None]]) -> list[int]:
    """Prompt tokens as the server counts them: a raw prompt with special tokens, a chat as its rendered template
    (generation prompt included) encoded without adding special tokens; batched."""
    if not sent:
        return []
    if sent[0][1] is None:
        return [len(ids) for ids in tokenizer([p or "" for p, _ in sent], add_special_tokens=True)["input_ids"]]
    texts = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for _, m in sent]
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
