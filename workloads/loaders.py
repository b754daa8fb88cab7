"""Readers for the public trace files a user downloads; every malformed row is reported by file, row and problem.

Formats: Azure LLM inference CSV (2023 and 2024), Mooncake JSONL with hash_ids, BurstGPT CSV, ShareGPT JSON
(lengths measured with the target tokenizer), and generic CSV/JSONL with input_len / output_len / timestamp.
Timestamps are returned in seconds from the trace's first request; rows are kept in file order (a trace whose
timestamps go backwards is rejected rather than silently re-sorted).
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from workloads.spec import RequestSpec, WorkloadFormatError

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens")
MOONCAKE_BLOCK_SIZE = 512
# Generic column names, first match wins (ours, Mooncake/vLLM timed_trace, Vidur/Etalon, Azure).
INPUT_ALIASES = ("input_len", "input_length", "prompt_len", "num_prefill_tokens", "ContextTokens", "input_tokens")
OUTPUT_ALIASES = ("output_len", "output_length", "num_decode_tokens", "GeneratedTokens", "output_tokens")
TIMESTAMP_ALIASES = ("timestamp", "arrival_time", "arrived_at")
CLASS_ALIASES = ("class", "request_class", "slo_class")  # optional: the request's class for per-class SLOs
_AZURE_TIME = re.compile(r"^(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2})(?:\.(\d+))?(Z|[+-]\d{2}:?\d{2})?$")


def _count(value: Any, path: Path, row: int, column: str, minimum: int, line: int | None = None) -> int:
    """An integer token count >= minimum; accepts "12" and 12.0 but not "12.5", "", or -3."""
    try:
        number = float(value) if isinstance(value, str) else value
        if isinstance(number, bool) or not isinstance(number, (int, float)) or number != int(number):
            raise ValueError
        count = int(number)
    except (TypeError, ValueError, OverflowError):
        raise WorkloadFormatError(path, row, f"{column} is {value!r}, not an integer token count", line) from None
    if count < minimum:
        raise WorkloadFormatError(path, row, f"{column} is {count}, must be >= {minimum}", line)
    return count


def _seconds(value: Any, path: Path, row: int, column: str, line: int | None = None) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise WorkloadFormatError(path, row, f"{column} is {value!r}, not a number", line) from None
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        raise WorkloadFormatError(path, row, f"{column} is {value!r}, not a finite number", line)
    return seconds


def _rebase(specs: list[RequestSpec], path: Path, rows: list[int]) -> list[RequestSpec]:
    """Timestamps relative to the first request; a trace that goes back in time is an error."""
    if not specs or specs[0].timestamp is None:
        return specs
    start = specs[0].timestamp
    previous = start
    for spec, row in zip(specs, rows, strict=True):
        assert spec.timestamp is not None
        if spec.timestamp < previous:
            raise WorkloadFormatError(path, row, f"timestamp goes backwards ({spec.timestamp} after {previous})")
        previous = spec.timestamp
        spec.timestamp = spec.timestamp - start
    return specs


def _csv_rows(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, int, dict[str, str]]]:
    """(data row number from 1, file line number, row) with a header check that names the missing columns."""
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        header = reader.fieldnames or []
        missing = [column for column in required if column not in header]
        if missing:
            raise WorkloadFormatError(path, None, f"missing column(s) {missing}; the header is {header}")
        for row_number, row in enumerate(reader, start=1):
            if None in row or any(value is None for value in row.values()):
                raise WorkloadFormatError(
                    path, row_number, f"has {len(header)} columns expected, got a different number", reader.line_num
                )
            yield row_number, reader.line_num, row


def parse_azure_timestamp(text: str) -> tuple[int, float]:
    """(whole epoch seconds, fraction) of '2023-11-16 18:17:03.9799600' (2023, no zone = UTC) or
    '...00.009930+00:00' (2024); kept apart so 100 ns stamps survive float arithmetic."""
    match = _AZURE_TIME.match(text.strip())
    if match is None:
        raise ValueError(f"timestamp {text!r} is not 'YYYY-MM-DD HH:MM:SS[.fraction][zone]'")
    whole, fraction, zone = match.groups()
    moment = datetime.fromisoformat(whole.replace(" ", "T") + (zone or "+00:00").replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp()), (int(fraction) / 10 ** len(fraction) if fraction else 0.0)


def load_azure_csv(path: str | Path) -> list[RequestSpec]:
    """Azure LLM inference trace, 2023 or 2024 format: TIMESTAMP, ContextTokens, GeneratedTokens."""
    path = Path(path)
    specs: list[RequestSpec] = []
    rows: list[int] = []
    first_whole: int | None = None
    for row, line, record in _csv_rows(path, AZURE_COLUMNS):
        try:
            whole, fraction = parse_azure_timestamp(record["TIMESTAMP"])
        except ValueError as error:
            raise WorkloadFormatError(path, row, str(error), line) from None
        first_whole = whole if first_whole is None else first_whole
        timestamp = (whole - first_whole) + fraction
        specs.append(
            RequestSpec(
                input_len=_count(record["ContextTokens"], path, row, "ContextTokens", 1, line),
                output_len=_count(record["GeneratedTokens"], path, row, "GeneratedTokens", 0, line),
                timestamp=timestamp,
            )
        )
        rows.append(row)
    return _rebase(specs, path, rows)


def _jsonl_records(path: Path) -> Iterator[tuple[int, dict]]:
    with open(path, encoding="utf-8") as handle:
        for row, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as error:
                raise WorkloadFormatError(path, row, f"invalid JSON: {error.msg} at column {error.colno}") from None
            if not isinstance(record, dict):
                raise WorkloadFormatError(path, row, f"expected a JSON object, got {type(record).__name__}")
            yield row, record


def _hash_ids(value: Any, path: Path, row: int) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in value):
        raise WorkloadFormatError(path, row, f"hash_ids must be a list of integers, got {str(value)[:60]!r}")
    return value


def load_mooncake_jsonl(path: str | Path, block_size: int = MOONCAKE_BLOCK_SIZE) -> list[RequestSpec]:
    """Mooncake trace: timestamp (ms), input_length, output_length, hash_ids (one per block_size tokens)."""
    path = Path(path)
    specs: list[RequestSpec] = []
    rows: list[int] = []
    for row, record in _jsonl_records(path):
        for key in ("timestamp", "input_length", "output_length", "hash_ids"):
            if key not in record:
                raise WorkloadFormatError(path, row, f"missing field {key!r}")
        input_len = _count(record["input_length"], path, row, "input_length", 1)
        hash_ids = _hash_ids(record["hash_ids"], path, row)
        if len(hash_ids) > -(-input_len // block_size):
            raise WorkloadFormatError(
                path,
                row,
                f"{len(hash_ids)} hash_ids need more than input_length {input_len} at block size "
                f"{block_size}; is the block size right?",
            )
        specs.append(
            RequestSpec(
                input_len=input_len,
                output_len=_count(record["output_length"], path, row, "output_length", 0),
                timestamp=_seconds(record["timestamp"], path, row, "timestamp") / 1000.0,
                prefix_ids=hash_ids,
                prefix_block_size=block_size,
            )
        )
        rows.append(row)
    return _rebase(specs, path, rows)


def load_burstgpt_csv(path: str | Path, model: str | None = None, include_failures: bool = False) -> list[RequestSpec]:
    """BurstGPT CSV (Timestamp in s, Model, Request tokens, Response tokens, ...). Failed requests (0 response
    tokens) are skipped unless include_failures; `model` keeps one model's rows (e.g. "ChatGPT", "GPT-4")."""
    path = Path(path)
    specs: list[RequestSpec] = []
    rows: list[int] = []
    for row, line, record in _csv_rows(path, BURSTGPT_COLUMNS):
        if model is not None and record["Model"] != model:
            continue
        output_len = _count(record["Response tokens"], path, row, "Response tokens", 0, line)
        if output_len == 0 and not include_failures:
            continue
        specs.append(
            RequestSpec(
                input_len=_count(record["Request tokens"], path, row, "Request tokens", 0, line),
                output_len=output_len,
                timestamp=_seconds(record["Timestamp"], path, row, "Timestamp", line),
            )
        )
        rows.append(row)
    return _rebase(specs, path, rows)


def load_sharegpt_json(path: str | Path, tokenizer: Any, output_len: int | None = None) -> list[RequestSpec]:
    """ShareGPT JSON as vLLM reads it: the first human turn is the prompt, the first reply's length (measured
    with `tokenizer`, the target model's) is the output length unless output_len overrides it."""
    path = Path(path)
    if tokenizer is None:
        raise ValueError(f"{path}: ShareGPT holds text; pass tokenizer= (the target model's) to measure lengths")
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise WorkloadFormatError(path, None, f"invalid JSON: {error.msg} at line {error.lineno}") from None
    if not isinstance(entries, list):
        raise WorkloadFormatError(path, None, "expected a JSON list of conversations")
    prompts: list[str] = []
    replies: list[str] = []
    for row, entry in enumerate(entries, start=1):
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list):
            raise WorkloadFormatError(path, row, "entry has no 'conversations' list")
        if len(turns) < 2:
            continue  # vLLM skips single-turn entries too
        if not all(isinstance(turn, dict) and isinstance(turn.get("value"), str) for turn in turns[:2]):
            raise WorkloadFormatError(path, row, "the first two turns must be objects with a string 'value'")
        prompts.append(turns[0]["value"])
        replies.append(turns[1]["value"])
    prompt_ids = tokenizer(prompts, add_special_tokens=True)["input_ids"] if prompts else []
    reply_ids = tokenizer(replies, add_special_tokens=False)["input_ids"] if replies and output_len is None else []
    return [
        RequestSpec(input_len=len(ids), output_len=output_len if output_len is not None else len(reply_ids[i]))
        for i, ids in enumerate(prompt_ids)
        if len(ids) > 0
    ]


def _pick(columns: list[str], aliases: tuple[str, ...]) -> str | None:
    return next((alias for alias in aliases if alias in columns), None)


def load_table(path: str | Path, timestamp_unit_s: float = 1.0) -> list[RequestSpec]:
    """Generic CSV or JSONL with input_len / output_len (or a known alias), optional timestamp (seconds unless
    timestamp_unit_s says otherwise), optional class (CLASS_ALIASES; empty: none) and, in JSONL, hash_ids."""
    path = Path(path)
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        records: Iterator[tuple[int, int | None, dict]] = ((row, None, rec) for row, rec in _jsonl_records(path))
    else:
        records = _csv_rows(path, ())
    specs: list[RequestSpec] = []
    rows: list[int] = []
    for row, line, record in records:
        keys = list(record)
        input_key, output_key = _pick(keys, INPUT_ALIASES), _pick(keys, OUTPUT_ALIASES)
        if input_key is None or output_key is None:
            raise WorkloadFormatError(
                path,
                row,
                f"needs an input column (one of {INPUT_ALIASES}) and an output column "
                f"(one of {OUTPUT_ALIASES}); found {keys}",
                line,
            )
        timestamp_key = _pick(keys, TIMESTAMP_ALIASES)
        class_key = _pick(keys, CLASS_ALIASES)
        request_class = None if class_key is None or record[class_key] in ("", None) else str(record[class_key])
        if request_class is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+", request_class):
            raise WorkloadFormatError(
                path, row, f"{class_key} is {request_class!r}: a class is letters, digits, '_', '.' or '-'", line
            )
        has_time = timestamp_key is not None and record[timestamp_key] not in ("", None)
        if specs and has_time != (specs[0].timestamp is not None):
            raise WorkloadFormatError(path, row, "timestamp present on some rows and missing on others", line)
        specs.append(
            RequestSpec(
                input_len=_count(record[input_key], path, row, input_key, 1, line),
                output_len=_count(record[output_key], path, row, output_key, 0, line),
                timestamp=_seconds(record[timestamp_key], path, row, timestamp_key, line) * timestamp_unit_s
                if has_time and timestamp_key
                else None,
                prefix_ids=_hash_ids(record["hash_ids"], path, row) if "hash_ids" in record else None,
                request_class=request_class,
            )
        )
        rows.append(row)
    if not specs:
        raise WorkloadFormatError(path, None, "no requests in the file")
    return _rebase(specs, path, rows)


def detect_format(path: str | Path) -> str:
    """'azure', 'burstgpt', 'mooncake', 'sharegpt' or 'table', from the extension and the first line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such trace file")
    with open(path, encoding="utf-8") as handle:
        first = handle.readline()
    if path.suffix.lower() == ".json":
        return "sharegpt"
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        return "mooncake" if '"hash_ids"' in first and '"input_length"' in first else "table"
    header = next(csv.reader([first]), [])
    if all(column in header for column in AZURE_COLUMNS):
        return "azure"
    if all(column in header for column in BURSTGPT_COLUMNS):
        return "burstgpt"
    return "table"


def load_trace(path: str | Path, tokenizer: Any = None, **options: Any) -> list[RequestSpec]:
    """Read any supported trace file, choosing the reader by detect_format."""
    kind = detect_format(path)
    if kind == "azure":
        return load_azure_csv(path)
    if kind == "burstgpt":
        return load_burstgpt_csv(path, **options)
    if kind == "mooncake":
        return load_mooncake_jsonl(path, **options)
    if kind == "sharegpt":
        return load_sharegpt_json(path, tokenizer, **options)
    return load_table(path, **options)
