"""Sessions from real conversations (`bench sweep --conversations FILE`) against the mock: the recorded history,
the recorded reply lengths, think time, sessions as the unit of concurrency."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import cli
from sweep.mock.calibrate import start_mock
from sweep.point.client import ClientConfig
from sweep.point.runner import PointSpec, WorkloadConfig, run_point


def sharegpt_file(path: Path) -> Path:
    """Three ShareGPT-format conversations of 3, 2 and 1 turns."""
    replies = ["one two three", "four five", "six seven eight nine", "ten", "eleven twelve", "thirteen"]
    conversations, reply = [], iter(replies)
    for number, turns in enumerate((3, 2, 1)):
        messages = []
        for k in range(turns):
            messages += [{"from": "human", "value": f"question {k} of conversation {number}"},
                         {"from": "gpt", "value": next(reply)}]  # fmt: skip
        conversations.append({"id": f"c{number}", "conversations": messages})
    path.write_text(json.dumps(conversations))
    return path


def test_sessions_replay_the_recorded_conversations(tmp_path: Path) -> None:
    from engine.tokenizer import get_tokenizer

    tokenizer = get_tokenizer("tiny-random")
    path = sharegpt_file(tmp_path / "sharegpt.json")
    spec = PointSpec(label="c0002", mode="concurrency", concurrency=2, num_prompts=6, think_time_s=0.05)
    workload = WorkloadConfig(endpoint="chat", conversations=str(path))
    with start_mock(5.0, 1.0, tmp_path / "mock.log") as mock:
        run = run_point(ClientConfig(mock.url, "mock", endpoint="chat"), spec, workload, tokenizer, salt="s")
    assert len(run.records) == 6 and all(r.success for r in run.records)
    recorded = {c["id"]: c["conversations"] for c in json.loads(path.read_text())}
    sent = {p.index: p for p in run.prompts}
    sessions: dict[int, list] = {}
    for r in run.records:
        sessions.setdefault(r.session, []).append(r)
    assert sorted(len(turns) for turns in sessions.values()) == [1, 2, 3]  # one session per conversation
    for number, turns in sessions.items():
        turns.sort(key=lambda r: r.turn)
        first = sent[turns[0].index].messages[0]["content"]
        assert first.startswith(f"[s-c0002-s{number}] question 0 of conversation")  # salted per session
        conversation = recorded[f"c{first.split()[-1]}"]
        for k, r in enumerate(turns):
            messages = sent[r.index].messages
            assert [m["content"] for m in messages[1:]] == [m["value"] for m in conversation[1 : 2 * k + 1]]
            reply = conversation[2 * k + 1]["value"]
            assert r.output_tokens == len(tokenizer.encode(reply, add_special_tokens=False))  # the recorded length
            if k:
                assert r.intended_send_time >= turns[k - 1].end_time + 0.05  # the think time
    spans = sorted((min(r.send_time for r in t), max(r.end_time for r in t)) for t in sessions.values())
    assert spans[2][0] >= min(spans[0][1], spans[1][1])  # two sessions in flight: the third waits for a slot
    assert [s.output_len for s in run.specs] == [p.output_len for p in run.prompts]


def test_num_prompts_counts_turns_and_cuts_the_last_session(tmp_path: Path) -> None:
    from engine.tokenizer import get_tokenizer
    from workloads.sessions import conversation_sessions

    path = sharegpt_file(tmp_path / "sharegpt.json")
    tokenizer = get_tokenizer("tiny-random")
    specs, sessions = conversation_sessions(str(path), tokenizer, 4, 0, seed=0, salt="x")
    assert len(specs) == 4 and sum(len(s) for s in sessions) == 4
    _, cycled = conversation_sessions(str(path), tokenizer, None, 5, seed=0, salt="x")  # --duration: 5 sessions
    assert len(cycled) == 5  # the file has 3: it cycles, each session with its own salt
    assert len({s[0].messages[0]["content"] for s in cycled}) == 5
    with pytest.raises(ValueError, match="no conversation's first turn fits --max-model-len 5"):
        conversation_sessions(str(path), tokenizer, 4, 0, seed=0, salt="x", max_model_len=5)


def test_the_command_checks_the_flags_and_saves_the_file(tmp_path: Path) -> None:
    path = sharegpt_file(tmp_path / "sharegpt.json")
    runner = CliRunner()
    common = ["sweep", "--model", "mock", "--tokenizer", "tiny-random", "--no-report", "--no-calibration"]
    common += ["--no-server-metrics", "--conversations", str(path), "--concurrency", "2"]
    plain = runner.invoke(cli.app, [*common, "--url", "http://127.0.0.1:9/v1"])
    assert plain.exit_code == 2 and "--conversations needs --endpoint chat" in plain.output
    both = runner.invoke(cli.app, [*common, "--endpoint", "chat", "--turns", "3", "--url", "http://127.0.0.1:9/v1"])
    assert both.exit_code == 2 and "drop --turns" in both.output
    out = tmp_path / "run"
    with start_mock(1.0, 0.5, tmp_path / "mock.log") as mock:
        done = runner.invoke(
            cli.app, [*common, "--endpoint", "chat", "--num-prompts", "6", "--url", mock.url, "--output-dir", str(out)]
        )
    assert done.exit_code == 0, done.output
    config = json.loads((out / "config.json").read_text())
    assert config["workload"]["conversations"] == str(path)
    point = json.loads((out / "points" / "c0002.json").read_text())
    assert point["completed"] == 6 and point["sessions"] == 3
