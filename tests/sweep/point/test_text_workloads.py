"""Text workloads (copy-heavy) through `bench sweep`: the texts are sent as they are and counted with the
target's tokenizer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import workloads
from engine.tokenizer import get_tokenizer
from sweep.mock.calibrate import start_mock
from sweep.point.prompts import build_prompts
from sweep.point.runner import WorkloadConfig

REPO = Path(__file__).resolve().parents[3]


def test_copy_heavy_prompts_carry_the_texts_and_their_token_counts() -> None:
    tokenizer = get_tokenizer("tiny-random")
    texts = workloads.load_texts("copy-heavy", num_requests=3, seed=5, output_len=40)
    for endpoint in ("chat", "completions"):
        config = WorkloadConfig(workload="copy-heavy", output_len=40, seed=5, endpoint=endpoint)
        specs, prompts, fit_report = build_prompts(config, tokenizer, 3, salt="s1")
        assert fit_report is None and [s.output_len for s in specs] == [40, 40, 40]
        for text, spec, prompt in zip(texts, specs, prompts, strict=True):
            sent = prompt.messages[0]["content"] if endpoint == "chat" else prompt.prompt
            assert sent == f"[s1] {text.prompt}"
            if endpoint == "chat":
                rendered = tokenizer.apply_chat_template(prompt.messages, add_generation_prompt=True, tokenize=False)
                expected = len(tokenizer(rendered, add_special_tokens=False)["input_ids"])
            else:
                expected = len(tokenizer(sent, add_special_tokens=True)["input_ids"])
            assert spec.input_len == prompt.input_len == expected


def test_bench_sweep_sends_the_copy_heavy_workload(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with start_mock(1.0, 0.5, tmp_path / "mock.log") as mock:
        args = ["sweep", "--url", mock.url, "--model", "mock", "--tokenizer", "tiny-random", "--no-report",
                "--workload", "copy-heavy", "--endpoint", "chat", "--output-len", "8", "--num-prompts", "3",
                "--concurrency", "1", "--output-dir", str(out)]  # fmt: skip
        done = subprocess.run([sys.executable, "-m", "cli", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    point = json.loads((out / "points" / "c0001.json").read_text())
    assert point["completed"] == 3 and point["failed"] == 0
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(row["requested_input_len"] > 40 for row in rows)  # a passage, not a few words
