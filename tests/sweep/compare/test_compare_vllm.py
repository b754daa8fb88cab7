"""`bench compare --target NAME=vllm`: a real-vLLM target (here the fake `vllm serve` of tests/sweep/
fake_vllm_helpers.py) beside a mock one, its knobs as vLLM's flags, the knobs vLLM lacks refused by name before
anything starts, and the weights every target served in its config.json and in the compare report."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app
from sweep.compare.targets import Target, TargetError, launch_template, parse_target, target_weights
from tests.sweep.fake_vllm_helpers import fake_vllm

MOCK = f"{shlex.quote(sys.executable)} -m sweep.mock.server --port {{port}} --ttft-ms 2 --itl-ms 1"
LOAD = ["--model", "tiny-random", "--concurrency", "1", "--num-prompts", "4", "--input-len", "16",
        "--output-len", "4", "--rounds", "1", "--no-calibration", "--one-at-a-time"]  # fmt: skip


def exported_dir(tmp_path: Path) -> Path:
    """An HF directory as `bench model export-hf` leaves it: its marker names the source."""
    hf = tmp_path / "smollm2-hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "servelab-export.json").write_text(json.dumps({"model": "smollm2-135m", "source": "/cache/smollm2"}))
    return hf


def test_a_vllm_target_runs_vllm_serve_with_its_knob_flags_and_the_report_names_each_target_s_weights(
    tmp_path: Path,
) -> None:
    vllm, calls, _ = fake_vllm(tmp_path)
    hf, out = exported_dir(tmp_path), tmp_path / "out"
    result = CliRunner().invoke(app, ["compare", "--target", f"base=cmd:{MOCK}", "--target", "v=vllm:max_num_seqs=4",
                                      "--vllm-model", str(hf), "--vllm-command", str(vllm), *LOAD,
                                      "--output-dir", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    (call,) = [json.loads(line) for line in calls.read_text().splitlines()]
    assert call["command"] == "serve" and call["model"] == str(hf.resolve())
    assert call["max_num_seqs"] == 4 and call["served_model_name"] == "tiny-random"  # what the client sends
    assert json.loads((out / "v" / "points" / "c0001.json").read_text())["completed"] == 4
    weights = json.loads((out / "compare.json").read_text())["weights"]
    assert weights["v"] == {"source": str(hf.resolve()), "dtype": "auto", "exported_from": "/cache/smollm2",
                            "exported_model": "smollm2-135m"}  # fmt: skip
    assert weights["base"] == {"source": None}
    assert json.loads((out / "v" / "config.json").read_text())["target"]["weights"] == weights["v"]
    report = (out / "compare.md").read_text()
    assert f"- `v`: {hf.resolve()} (auto), exported from /cache/smollm2" in report
    assert "- `base`: unknown" in report and "exported from /cache/smollm2" in (out / "compare.html").read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target", "v=vllm:cpu_threads=2"], "vLLM does not take cpu_threads (our torch threads"),
        (["--target", "v=vllm:quantization=int8,max_num_seqs=2"], "vLLM does not take quantization"),
        (["--target", "v=vllm", "--quantization", "int8"], "vLLM does not take quantization"),
        (["--target", "v=vllm"], "a vllm target needs --vllm-model DIR"),
        (["--target", "v=vllm", "--vllm-model", "tiny-random"], "loads an HF directory or a hub id"),
        (["--target", "v=engine", "--vllm-model", "org/model"], "are for a vllm target"),
    ],
)
def test_what_a_vllm_target_cannot_run_is_a_usage_error_naming_it_before_anything_starts(
    tmp_path: Path, args: list[str], message: str
) -> None:
    vllm, calls, _ = fake_vllm(tmp_path)
    result = CliRunner().invoke(app, ["compare", "--target", f"base=cmd:{MOCK}", *args, "--vllm-command", str(vllm),
                                      *LOAD, "--output-dir", str(tmp_path / "out")])  # fmt: skip
    assert result.exit_code == 2, result.output
    assert message in " ".join(re.sub("[│╭╮╰╯─]", " ", result.output).split()) and "Traceback" not in result.output
    assert not (tmp_path / "out").exists() and not calls.exists()


def test_a_vllm_template_loads_the_directory_and_serves_the_model_name(tmp_path: Path) -> None:
    target = parse_target("v=vllm:max_num_seqs=8,enable_prefix_caching=false")
    assert target == Target("v", "vllm", knobs={"max_num_seqs": 8, "enable_prefix_caching": False})
    assert target.describe() == "vllm:max_num_seqs=8,enable_prefix_caching=False"
    template = launch_template(target, "smollm2-135m", target.knobs, None, 4096, ("/v/bin/vllm", "/m/a b"))
    assert template == ("/v/bin/vllm serve '/m/a b' --host {host} --port {port} --served-model-name {model} "
                        "--max-num-seqs 8 --no-enable-prefix-caching")  # fmt: skip
    with pytest.raises(TargetError, match="inject_step_delay_ms"):
        parse_target("v=vllm:inject_step_delay_ms=5")


def test_engine_and_llama_cpp_targets_record_the_file_they_load(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    engine = target_weights(Target("e", "engine"), str(gguf), {"dtype": "bfloat16", "quantization": "int8"}, None)
    assert engine == {"source": str(gguf), "dtype": "bfloat16", "quantization": "int8"}
    assert target_weights(Target("e", "engine"), str(tmp_path), {}, None) == {"source": str(tmp_path.resolve()),
                                                                             "dtype": "auto"}  # fmt: skip
    assert target_weights(Target("l", "llama.cpp"), str(gguf), {}, None)["source"] == str(gguf)
    assert target_weights(Target("u", "url", "http://127.0.0.1:1"), str(gguf), {}, None) == {"source": None}
