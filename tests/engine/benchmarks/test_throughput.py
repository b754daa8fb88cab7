"""`bench throughput` runs end to end on tiny-random for both backends and writes valid JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app

FIELDS = (
    "requests_per_second",
    "tokens_per_second",
    "output_tokens_per_second",
    "elapsed_time",
    "num_requests",
    "total_num_tokens",
)


@pytest.mark.parametrize("backend", ["engine", "hf"])
def test_throughput_writes_json(backend: str, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    args = ["throughput", "--backend", backend, "--model", "tiny-random", "--num-prompts", "3"]
    args += ["--input-len", "12", "--output-len", "5", "--hf-batch-size", "2", "--output-json", str(out)]
    args += ["--max-model-len", "64", "--max-num-seqs", "2"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert all(data[field] > 0 for field in FIELDS)
    assert (data["num_requests"], data["total_num_tokens"], data["total_output_tokens"]) == (3, 51, 15)
    assert data["backend"] == backend and data["dtype"] == "float32"
    if backend == "engine":
        assert "KV cache: " in result.output and " tokens = " in result.output  # how many blocks and tokens fit
        assert 0 < data["roofline_fraction"] and data["roofline_gflops"] == max(data["matmul_gflops"].values())
    assert "Throughput:" in result.output


def test_lengths_from_a_workload(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    args = ["throughput", "--model", "tiny-random", "--workload", "fixed", "--num-prompts", "2", "--input-len", "9"]
    args += ["--output-len", "4", "--max-model-len", "64", "--output-json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["total_num_tokens"] == 2 * (9 + 4)


def test_unknown_workload_is_a_clear_error() -> None:
    result = CliRunner().invoke(app, ["throughput", "--model", "tiny-random", "--workload", "no-such-mix"])
    assert result.exit_code != 0 and "unknown workload" in result.output


def test_prepare_model_prints_the_directory() -> None:
    result = CliRunner().invoke(app, ["model", "prepare", "tiny-random"])
    assert result.exit_code == 0, result.output
    assert Path(result.output.strip().splitlines()[-1], "config.json").is_file()


def test_bad_input_ends_with_a_message_not_a_traceback(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["model", "prepare", str(tmp_path / "missing.gguf")])
    assert result.exit_code == 1 and "does not exist" in result.output
    args = ["throughput", "--model", "tiny-random", "--max-model-len", "99999", "--num-prompts", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1 and "context length" in result.output


def test_engine_knobs_use_vllm_flag_names(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.benchmarks import throughput
    from engine.config import EngineConfig

    seen: dict[str, object] = {}

    def fake_run_engine(model: str, requests: list, knobs: dict[str, object]) -> object:
        seen.update(knobs)
        raise ValueError("stop here")

    monkeypatch.setattr(throughput, "run_engine", fake_run_engine)
    args = ["throughput", "--model", "tiny-random", "--num-prompts", "1", "--input-len", "4", "--output-len", "2"]
    args += ["--dtype", "float32", "--device", "cpu", "--max-model-len", "64", "--max-num-seqs", "3",
             "--max-num-batched-tokens", "48", "--no-enable-prefix-caching", "--enable-chunked-prefill",
             "--block-size", "32", "--gpu-memory-utilization", "0.5", "--num-gpu-blocks-override", "20", "--seed", "4"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1 and "stop here" in result.output
    assert seen == {
        "dtype": "float32", "device": "cpu", "max_model_len": 64, "max_num_seqs": 3, "max_num_batched_tokens": 48,
        "enable_prefix_caching": False, "enable_chunked_prefill": True, "block_size": 32,
        "gpu_memory_utilization": 0.5, "num_gpu_blocks_override": 20, "seed": 4,
    }  # fmt: skip
    EngineConfig.from_kwargs(model="tiny-random", **seen)  # type: ignore[arg-type]
