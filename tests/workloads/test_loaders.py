import json

import pytest

from engine.tokenizer import get_tokenizer
from workloads.loaders import (
    detect_format,
    load_azure_csv,
    load_burstgpt_csv,
    load_mooncake_jsonl,
    load_sharegpt_json,
    load_table,
    load_trace,
)
from workloads.spec import WorkloadFormatError


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_azure_2023_and_2024_formats(tmp_path):
    path = write(
        tmp_path,
        "a.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.9799600,4808,10\n2023-11-16 18:17:04.0319601,3180,8\n",
    )
    specs = load_azure_csv(path)
    assert [(s.input_len, s.output_len) for s in specs] == [(4808, 10), (3180, 8)]
    assert specs[0].timestamp == 0.0 and specs[1].timestamp == pytest.approx(0.0520001, abs=1e-9)
    path = write(
        tmp_path,
        "b.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-05-10 00:00:00.009930+00:00,100,5\n2024-05-10 00:00:01.5+00:00,200,0\n",
    )
    specs = load_trace(path)
    assert specs[1].timestamp == pytest.approx(1.49007) and specs[1].output_len == 0


@pytest.mark.parametrize(
    ("body", "row", "problem"),
    [
        ("2023-11-16 18:17:03.97,12.5,3\n", 1, "ContextTokens is '12.5'"),
        ("2023-11-16 18:17:03.97,12,3\n2023-11-16 18:17:04,-1,3\n", 2, "ContextTokens is -1"),
        ("2023-11-16 18:17:03.97,12,3\nyesterday,12,3\n", 2, "is not 'YYYY-MM-DD"),
        ("2023-11-16 18:17:03.97,12,3\n2023-11-16 18:17:02,12,3\n", 2, "timestamp goes backwards"),
        ("2023-11-16 18:17:03.97,12\n", 1, "columns"),
    ],
)
def test_azure_rejects_malformed_rows(tmp_path, body, row, problem):
    path = write(tmp_path, "bad.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n" + body)
    with pytest.raises(WorkloadFormatError, match=problem) as error:
        load_azure_csv(path)
    assert str(path) in str(error.value) and f"row {row}" in str(error.value)


def test_azure_missing_column_is_named(tmp_path):
    path = write(tmp_path, "bad.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:17:03,1\n")
    with pytest.raises(WorkloadFormatError, match=r"missing column\(s\) \['GeneratedTokens'\]"):
        load_azure_csv(path)


def mooncake_line(**fields):
    record = {"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]} | fields
    return json.dumps(record) + "\n"


def test_mooncake(tmp_path):
    path = write(tmp_path, "t.jsonl", mooncake_line() + mooncake_line(timestamp=3000, hash_ids=[0, 2]))
    specs = load_mooncake_jsonl(path)
    assert detect_format(path) == "mooncake"
    assert specs[1].timestamp == 3.0 and specs[1].prefix_ids == [0, 2] and specs[1].prefix_block_size == 512


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("{not json\n", "invalid JSON"),
        (json.dumps({"timestamp": 0, "input_length": 5, "output_length": 1}) + "\n", "missing field 'hash_ids'"),
        (mooncake_line(hash_ids="0,1"), "hash_ids must be a list of integers"),
        (mooncake_line(input_length=100, hash_ids=[0, 1, 2]), "3 hash_ids need more than input_length 100"),
        (mooncake_line(output_length="x"), "output_length is 'x'"),
    ],
)
def test_mooncake_rejects_malformed_rows(tmp_path, line, problem):
    path = write(tmp_path, "t.jsonl", mooncake_line() + line)
    with pytest.raises(WorkloadFormatError, match=problem) as error:
        load_mooncake_jsonl(path)
    assert str(error.value).startswith(f"{path}: row 2")


BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def test_burstgpt(tmp_path):
    path = write(
        tmp_path,
        "b.csv",
        BURST_HEADER + "5,ChatGPT,472,18,490,Conversation log\n45,GPT-4,1087,0,1087,Conversation log\n"
        "118,GPT-4,417,276,693,Conversation log\n",
    )
    assert detect_format(path) == "burstgpt"
    specs = load_burstgpt_csv(path)
    assert [(s.input_len, s.output_len, s.timestamp) for s in specs] == [(472, 18, 0.0), (417, 276, 113.0)]
    assert len(load_burstgpt_csv(path, include_failures=True)) == 3
    assert [s.input_len for s in load_burstgpt_csv(path, model="GPT-4")] == [417]
    bad = write(tmp_path, "bad.csv", BURST_HEADER + "5,ChatGPT,472,lots,490,Conversation log\n")
    with pytest.raises(WorkloadFormatError, match=r"row 1 \(line 2\): Response tokens is 'lots'"):
        load_burstgpt_csv(bad)


def test_sharegpt_measures_with_the_target_tokenizer(tmp_path):
    tokenizer = get_tokenizer("smollm2-135m")
    entries = [
        {
            "id": "a",
            "conversations": [
                {"from": "human", "value": "Hello there, how are you?"},
                {"from": "gpt", "value": "Fine, thanks."},
            ],
        },
        {"id": "b", "conversations": [{"from": "human", "value": "single turn"}]},
    ]
    path = write(tmp_path, "s.json", json.dumps(entries))
    specs = load_sharegpt_json(path, tokenizer)
    assert len(specs) == 1
    assert specs[0].input_len == len(tokenizer("Hello there, how are you?").input_ids)
    assert specs[0].output_len == len(tokenizer("Fine, thanks.", add_special_tokens=False).input_ids)
    bad = write(tmp_path, "bad.json", json.dumps(entries + [{"id": "c"}]))
    with pytest.raises(WorkloadFormatError, match=r"row 3: entry has no 'conversations' list"):
        load_sharegpt_json(bad, tokenizer)
    with pytest.raises(ValueError, match="pass tokenizer="):
        load_sharegpt_json(path, None)


@pytest.mark.parametrize(
    ("text", "where", "problem"),
    [
        ('[{"conversations": [', "", "invalid JSON: .* at line 1"),
        ('{"conversations": []}', "", "expected a JSON list of conversations"),
        ('[{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt"}]}]', ": row 1", "string 'value'"),
        ('[{"conversations": []}, {"conversations": ["hi", "there"]}]', ": row 2", "first two turns must be objects"),
    ],
)
def test_sharegpt_rejects_malformed_files(tmp_path, text, where, problem):
    path = write(tmp_path, "bad.json", text)
    with pytest.raises(WorkloadFormatError, match=problem) as error:
        load_sharegpt_json(path, tokenizer=object())  # rejected before any text is measured
    assert str(error.value).startswith(f"{path}{where}: ")

def test_generic_tables(tmp_path):
    csv_path = write(tmp_path, "t.csv", "input_len,output_len,timestamp\n10,5,100.5\n20,6,101\n")
    specs = load_table(csv_path)
    assert [(s.input_len, s.output_len, s.timestamp) for s in specs] == [(10, 5, 0.0), (20, 6, 0.5)]
    vidur = write(tmp_path, "v.csv", "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n7,3,10,2.3\n")
    assert load_trace(vidur)[0].input_len == 7 and load_trace(vidur)[0].timestamp is None
    jsonl = write(tmp_path, "t.jsonl", '{"input_length": 4, "output_length": 2}\n')
    assert load_table(jsonl)[0].output_len == 2


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("prompt,answer\n1,2\n", "needs an input column"),
        ("input_len,output_len,timestamp\n10,5,1\n10,5,\n", "timestamp present on some rows and missing"),
        ("input_len,output_len\n10,5\n0,5\n", "input_len is 0, must be >= 1"),
        ("input_len,output_len,timestamp\n10,5,1\n10,5,soon\n", "timestamp is 'soon', not a number"),
    ],
)
def test_generic_table_rejects_malformed_rows(tmp_path, text, problem):
    path = write(tmp_path, "t.csv", text)
    with pytest.raises(WorkloadFormatError, match=problem) as error:
        load_table(path)
    assert str(path) in str(error.value) and "row " in str(error.value)


def test_missing_file_and_empty_table(tmp_path):
    with pytest.raises(FileNotFoundError):
        detect_format(tmp_path / "nope.csv")
    with pytest.raises(WorkloadFormatError, match="no requests"):
        load_table(write(tmp_path, "e.csv", "input_len,output_len\n"))


def test_load_reads_trace_files_through_the_public_api(tmp_path):
    import workloads

    path = write(tmp_path, "t.jsonl", mooncake_line() + mooncake_line(timestamp=3000, input_length=3000))
    specs = workloads.load(str(path), max_model_len=2048, fit_policy="clip")
    assert [s.input_len for s in specs] == [1000, 2047] and workloads.last_fit_report().changed == 1
    entries = [{"conversations": [{"from": "human", "value": "hi there"}, {"from": "gpt", "value": "hello"}]}]
    sharegpt = write(tmp_path, "s.json", json.dumps(entries))
    (spec,) = workloads.load(str(sharegpt), tokenizer=get_tokenizer("smollm2-135m"), num_requests=1)
    assert spec.input_len == 2 and spec.output_len == 1
