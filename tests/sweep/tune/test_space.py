from __future__ import annotations

import json
import shlex
from pathlib import Path

import optuna
import pytest

from engine.config import engine_knobs, knob_args
from sweep.run.launcher import template_command
from sweep.tune.space import (
    DeviceInfo,
    SpaceError,
    build_space,
    default_knobs,
    engine_knob_names,
    fill_template,
    known_constraint_violation,
    serve_command,
)

CPU = DeviceInfo(device="cpu", model_max_len=2048, min_model_len=600)


def test_engine_knob_names_come_from_the_config_dataclasses() -> None:
    names = engine_knob_names()
    assert {"max_num_seqs", "max_num_batched_tokens", "block_size", "enable_prefix_caching", "max_model_len"} <= set(
        names
    )
    assert "quantization" in names and "tensor_parallel_size" in names and "pipeline_parallel_size" not in names


def test_default_space_is_every_knob_with_a_search_range() -> None:
    ranged = [spec.name for spec in engine_knobs().values() if spec.search is not None]
    fields = ["speculative_config.num_speculative_tokens", "speculative_config.method"]  # searched as its fields
    expected = [name for name in ranged if name != "speculative_config"] + fields
    assert sorted(k.name for k in default_knobs(CPU)) == sorted(expected)
    assert {"max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill", "block_size"} <= set(ranged)
    by_name = {k.name: k for k in default_knobs(DeviceInfo(device="cuda", model_max_len=4096))}
    assert by_name["max_num_seqs"].choices == [16, 32, 64, 128, 256, 512]  # a GPU gets its own range
    assert by_name["max_model_len"].choices == [1024, 2048, 4096]  # fractions of the model's context length
    assert by_name["enable_prefix_caching"].kind == "bool" and by_name["enable_prefix_caching"].choices == [False, True]
    assert {k.name: k for k in default_knobs(CPU)}["max_num_seqs"].choices == [2, 4, 8, 16, 32]


def test_cpu_space_excludes_what_the_device_and_workload_cannot_use() -> None:
    space = build_space(CPU)
    assert "gpu_memory_utilization" not in space.names
    assert any("gpu_memory_utilization: not tuned on cpu" in n for n in space.notes)
    max_len = next(k for k in space.knobs if k.name == "max_model_len")
    assert max_len.choices == [1024, 2048]  # 512 is shorter than the workload's 600-token requests
    assert any("excluded [512]" in n for n in space.notes)
    assert "gpu_memory_utilization" in build_space(DeviceInfo(device="cuda", model_max_len=4096)).names


def test_unknown_model_length_leaves_max_model_len_to_the_engine() -> None:
    space = build_space(DeviceInfo(device="cpu"))
    assert "max_model_len" not in space.names and "max_model_len" not in space.fixed


def test_tensor_parallel_sizes_are_those_of_the_model_and_the_devices_present() -> None:
    def tp_space(dev: DeviceInfo) -> tuple[list[int] | None, list[str]]:
        space = build_space(dev)
        knob = next((k for k in space.knobs if k.name == "tensor_parallel_size"), None)
        return (knob.choices if knob else None), [n for n in space.notes if n.startswith("tensor_parallel_size")]

    assert tp_space(DeviceInfo(device="cpu", num_cpus=2, tensor_parallel_sizes=(1, 2, 4)))[0] == [1, 2]
    choices, notes = tp_space(DeviceInfo(device="cuda", num_devices=8, tensor_parallel_sizes=(1, 3, 9)))
    assert choices is None and "tensor_parallel_size" not in build_space(DeviceInfo(device="cuda", num_devices=8)).fixed
    assert "excluded [2, 4, 8] (the model's attention and KV heads split only into [1, 3, 9])" in notes[0]
    assert "only 1 fits, not searched" in notes[0]
    assert tp_space(DeviceInfo(device="cuda", num_devices=4, tensor_parallel_sizes=(1, 2, 4, 8)))[0] == [1, 2, 4]
    assert tp_space(DeviceInfo(device="cpu", num_cpus=1))[0] is None  # one core: TP stays at the default, 1


@pytest.mark.parametrize("name", ["pipeline_parallel_size", "num_speculative_tokens", "max_num_sequences"])
def test_a_space_file_knob_that_is_not_an_engine_field_is_an_error_listing_the_knobs(
    tmp_path: Path, name: str
) -> None:
    path = tmp_path / "space.json"
    path.write_text(json.dumps({name: {"choices": [1, 2]}}))
    with pytest.raises(SpaceError, match=f"unknown knob {name!r}; the engine knobs are: model, tokenizer") as err:
        build_space(CPU, path)
    assert all(known in str(err.value) for known in engine_knobs())


def test_a_space_file_can_search_or_pin_any_engine_knob_but_the_model(tmp_path: Path) -> None:
    path = tmp_path / "space.json"
    path.write_text(json.dumps({"quantization": "none", "num_gpu_blocks_override": {"choices": [64, 128]}}))
    space = build_space(CPU, path)
    assert space.fixed["quantization"] == "none" and "num_gpu_blocks_override" in space.names
    path.write_text(json.dumps({"model": "tiny-random"}))
    with pytest.raises(SpaceError, match="bench tune --model"):
        build_space(CPU, path)


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_space_file_overrides_pins_and_removes_knobs(tmp_path: Path, suffix: str) -> None:
    spec = {"max_num_seqs": {"choices": [2, 4]}, "max_num_batched_tokens": {"low": 256, "high": 1024, "log": True},
            "block_size": 16, "enable_prefix_caching": None, "dtype": {"fixed": "float32"}}
    path = tmp_path / f"space{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(spec))
    else:
        import yaml

        path.write_text(yaml.safe_dump({"knobs": spec}))
    space = build_space(CPU, path)
    assert space.fixed["block_size"] == 16 and space.fixed["dtype"] == "float32"
    assert "enable_prefix_caching" not in space.names and "enable_prefix_caching" not in space.fixed
    trial = optuna.create_study().ask()
    knobs = space.suggest(trial)
    assert knobs["max_num_seqs"] in (2, 4) and 256 <= knobs["max_num_batched_tokens"] <= 1024
    assert isinstance(knobs["max_num_batched_tokens"], int)


def test_bad_space_files_are_clear_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"max_num_sequences": {"choices": [1]}}))
    with pytest.raises(SpaceError, match="unknown knob 'max_num_sequences'"):
        build_space(CPU, bad)
    bad.write_text(json.dumps({"max_num_seqs": {"choices": [1], "lo": 3}}))
    with pytest.raises(SpaceError, match="unknown setting"):
        build_space(CPU, bad)
    bad.write_text("{not json")
    with pytest.raises(SpaceError, match="not valid JSON"):
        build_space(CPU, bad)
    with pytest.raises(SpaceError, match="does not exist"):
        build_space(CPU, tmp_path / "missing.yaml")


def test_known_constraints() -> None:
    assert known_constraint_violation({"max_num_seqs": 64, "max_num_batched_tokens": 32}, None)
    off = {"enable_chunked_prefill": False, "max_num_batched_tokens": 512}
    assert "chunked prefill is off" in known_constraint_violation(off, 2048)
    assert known_constraint_violation({**off, "max_model_len": 512}, 2048) is None
    assert known_constraint_violation({"enable_chunked_prefill": True, "max_num_batched_tokens": 512}, 2048) is None


def test_serve_command_and_templates() -> None:
    knobs = {"max_num_seqs": 8, "enable_prefix_caching": False, "enable_chunked_prefill": True, "max_model_len": None}
    flags = ["--max-num-seqs", "8", "--no-enable-prefix-caching", "--enable-chunked-prefill"]
    assert shlex.split(serve_command("tiny-random", knobs)) == ["bench", "serve", "tiny-random", *flags]
    assert knob_args(knobs) == flags  # the flags a trial's built-in engine is launched with
    filled = fill_template("vllm serve {model} --port {port} --max-num-seqs {max_num_seqs} "
                           "{enable_prefix_caching_flag}", "m", knobs, port=9)
    assert filled == "vllm serve m --port 9 --max-num-seqs 8 --no-enable-prefix-caching"
    assert fill_template("x {knob_flags}", "m", {"block_size": 16}) == "x --block-size 16"
    tp = fill_template("vllm serve {model} {tensor_parallel_size_flag}", "m", {"tensor_parallel_size": 2})
    assert tp == "vllm serve m --tensor-parallel-size 2"  # vLLM's flag for external engines too
    with pytest.raises(SpaceError, match="max_num_sequences"):
        fill_template("vllm serve {model} --max-num-seqs {max_num_sequences}", "m", knobs)
    plain = "vllm serve {model} --host {host} --port {port} --max-num-seqs {max_num_seqs} --pc {enable_prefix_caching}"
    launched = template_command(plain, "m", "h", 5, knobs)
    assert shlex.split(fill_template(plain, "m", knobs, port=5, host="h")) == launched
    assert fill_template("x --len {max_model_len}", "m", knobs) == "x --len"  # engine default: nothing
