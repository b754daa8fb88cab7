"""`bench compare` through the CLI: bad input fails before anything starts, mock servers compared and gated,
the hidden old names `bench ab` and `bench compare-llama-cpp` (they run, and say the new spelling first), and
an end-to-end compare of two engine settings on tiny-random through the real HTTP server."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cli import app
from sweep.compare import commands

MOCK = f"{shlex.quote(sys.executable)} -m sweep.mock.server --port {{port}} --ttft-ms 5 --itl-ms 4"
LOAD = ["--model", "tiny-random", "--concurrency", "1,2", "--num-prompts", "12", "--input-len", "16",
        "--output-len", "8"]  # fmt: skip
GATE = ["--metric", "tpot_p50,failure_rate", "--noise-floor", "2%"]


def test_the_top_level_lists_compare_and_hides_the_old_names() -> None:
    import typer.main

    listed = CliRunner().invoke(app, ["--help"]).output
    assert "│ compare " in listed and "│ ab " not in listed and "│ compare-llama-cpp " not in listed
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    assert len([c for c in commands.values() if not c.hidden]) <= 13
    assert {"ab", "compare-llama-cpp"} <= set(commands)


@pytest.mark.parametrize(
    ("targets", "message"),
    [
        (["a=engine"], "at least two"),
        (["a=engine", "a=engine:max_num_seqs=4"], "given twice"),
        (["a=engine", "b=engine:max_num_seqs"], "KNOB=V"),
        (["a=engine", "b=url:http://127.0.0.1:8000:max_num_seqs=4"], "no engine knobs"),
        (["a=engine", "b=podman:x"], "unknown spec"),
    ],
)
def test_bad_targets_fail_before_anything_starts(tmp_path: Path, targets: list[str], message: str) -> None:
    args = ["compare", *(f"--target={t}" for t in targets), *LOAD, "--output-dir", str(tmp_path / "out")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_a_bad_ref_or_gate_option_fails_before_anything_starts(tmp_path: Path) -> None:
    ref = CliRunner().invoke(app, ["compare", "--target", "a=engine", "--target", "b=ref:no-such-ref-xyz", *LOAD,
                                   "--output-dir", str(tmp_path / "out")])  # fmt: skip
    assert ref.exit_code == 2 and "no-such-ref-xyz" in ref.output
    metric = CliRunner().invoke(app, ["compare", "--target", f"a=cmd:{MOCK}", "--target", f"b=cmd:{MOCK}", *LOAD,
                                      "--gate", "--metric", "goodput_p50", "--output-dir", str(tmp_path / "out")])
    assert metric.exit_code == 2 and "goodput" in metric.output
    assert not (tmp_path / "out").exists()


def test_compare_mock_servers_and_gate(tmp_path: Path) -> None:
    runner = CliRunner()
    base = ["compare", "--target", f"fast={'cmd:' + MOCK}", "--target", f"slow=cmd:{MOCK} --itl-ms 8", *LOAD,
            "--rounds", "2", "--no-calibration", "--one-at-a-time", *GATE]  # fmt: skip
    result = runner.invoke(app, [*base, "--gate", "--output-dir", str(tmp_path / "c"),
                                 "--junit-xml", str(tmp_path / "gate.xml")])  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "ratios to `fast`" in result.output and "regression" in result.output
    out = tmp_path / "c"
    for name in ("fast", "slow"):
        assert json.loads((out / name / "points" / "c0002.json").read_text())["num_repeats"] == 2
    rows = json.loads((out / "compare.json").read_text())["rows"]
    slow = next(r for r in rows if r["target"] == "slow" and r["load"] == 1)
    assert slow["ratios"]["median_tpot_ms"] > 1.5
    assert (out / "compare.html").exists() and (tmp_path / "gate.xml").exists()
    ungated = runner.invoke(app, [*base, "--output-dir", str(tmp_path / "c2")])
    assert ungated.exit_code == 0, ungated.output  # without --gate: the report only
    resumed = runner.invoke(app, [*base, "--output-dir", str(tmp_path / "c2"), "--resume"])
    assert resumed.exit_code == 0 and "already measured, kept" in resumed.output


def test_bench_ab_still_runs_and_says_the_new_spelling(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["ab", "--baseline-command", MOCK, "--candidate-command", MOCK,
                                      "--candidate-args", "--itl-ms 8", *LOAD, "--repeats", "2", *GATE,
                                      "--output-dir", str(tmp_path / "ab")])  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "now `bench compare --target baseline=SPEC --target candidate=SPEC --together --gate`" in result.stderr
    assert "Repeats: baseline 2, candidate 2" in result.output and "regression" in result.output
    run = tmp_path / "ab" / "candidate"
    assert "speed" in json.loads((run / "config.json").read_text())["calibration"]
    assert (run / "server.log").read_text().count("$ ") == 1  # together: one start for the whole A/B
    both = CliRunner().invoke(app, ["ab", "--baseline-ref", "HEAD", "--baseline-command", MOCK,
                                    "--candidate-ref", "HEAD", "--output-dir", str(tmp_path / "x")])  # fmt: skip
    assert both.exit_code == 2 and "exactly one of --baseline-ref or --baseline-command" in both.output


def test_bench_compare_llama_cpp_translates_to_targets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    def execute(judge: Any, config: Any, targets: list[Any], together: bool, gate: bool, *args: Any) -> None:
        seen.update(config=config, targets=targets, together=together, gate=gate)

    monkeypatch.setattr(commands, "check_targets", lambda listed: None)  # llama.cpp need not be installed here
    monkeypatch.setattr(commands, "execute", execute)
    result = CliRunner().invoke(app, ["compare-llama-cpp", "--settings", "none,int4", "--concurrency", "1,16",
                                      "--threads", "2", "--output-dir", str(tmp_path)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert ("now `bench compare --target llama.cpp=llama.cpp --target none=engine:quantization=none "
            "--target int4=engine:quantization=int4 --one-at-a-time`") in result.stderr
    assert [(t.name, t.kind, t.knobs) for t in seen["targets"]] == [
        ("llama.cpp", "llama.cpp", {}), ("none", "engine", {"quantization": "none"}),
        ("int4", "engine", {"quantization": "int4"})]  # fmt: skip
    config = seen["config"]
    assert not seen["together"] and not seen["gate"] and config.values == [1.0, 16.0] and config.repeats == 2
    assert config.engine_knobs == {"max_model_len": 256 + 128 + 64, "cpu_threads": 2}
    bad = CliRunner().invoke(app, ["compare-llama-cpp", "--rounds", "0"])
    assert bad.exit_code == 2 and "--rounds" in bad.output


@pytest.mark.slow
@pytest.mark.serial  # the gate's verdict on a 40 ms step delay needs a quiet machine: a second worker's load
def test_compare_two_engine_settings_on_tiny_random_with_the_gate(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, [
        "compare", "--target", "base=engine", "--target", "slow=engine:inject_step_delay_ms=40", "--model",
        "tiny-random", "--concurrency", "1,2", "--num-prompts", "8", "--input-len", "16", "--output-len", "8",
        "--rounds", "2", "--gate", "--metric", "tpot_p50", "--output-dir", str(tmp_path),
    ])  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "tpot_p50" in result.output and "❌ regression" in result.output
    rows = json.loads((tmp_path / "compare.json").read_text())["rows"]
    assert all(r["ratios"]["median_tpot_ms"] > 1.5 for r in rows if r["target"] == "slow")
    config = json.loads((tmp_path / "slow" / "config.json").read_text())
    assert config["target"]["engine_knobs"] == {"inject_step_delay_ms": 40.0}
