"""Engine configs: vLLM's knob names reach the right dataclass; every bad value is a ConfigError naming the knob;
max_model_len is resolved against the model when the config is built; every knob is declared once, on its field."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from engine.config import (
    COMPONENTS,
    CacheConfig,
    ConfigError,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    engine_knobs,
    knob_args,
    model_context_length,
    parse_byte_size,
)
from engine.distributed import valid_tensor_parallel_sizes
from engine.model_files import ModelNotFoundError


def test_flat_knobs_land_in_their_component() -> None:
    config = EngineConfig.from_kwargs(
        model="tiny-random", tokenizer="smollm2-135m", dtype="bfloat16", max_model_len=128, seed=3, device="cpu",
        quantization="none", block_size=32, gpu_memory_utilization=0.5, num_gpu_blocks_override=40,
        enable_prefix_caching=False, max_num_seqs=4, max_num_batched_tokens=128, enable_chunked_prefill=False,
    )  # fmt: skip
    mc, cc, sc = config.model_config, config.cache_config, config.scheduler_config
    assert (mc.model, mc.tokenizer, mc.dtype, mc.max_model_len, mc.seed, mc.device, mc.quantization) == (
        "tiny-random", "smollm2-135m", "bfloat16", 128, 3, "cpu", "none",
    )  # fmt: skip
    assert (cc.block_size, cc.gpu_memory_utilization, cc.num_gpu_blocks_override, cc.enable_prefix_caching) == (
        32, 0.5, 40, False,
    )  # fmt: skip
    assert (sc.max_num_seqs, sc.max_num_batched_tokens, sc.enable_chunked_prefill) == (4, 128, False)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4294967296", 4 * 2**30), ("4GiB", 4 * 2**30), ("4G", 4 * 2**30), ("4GB", 4 * 10**9), ("1.5 GiB", 3 * 2**29),
     ("512MiB", 2**29), ("64K", 2**16), ("2TB", 2 * 10**12)],
)  # fmt: skip
def test_byte_sizes_take_vllm_spellings(text: str, expected: int) -> None:
    """vLLM's `4G` is binary (as its human_readable_int's upper-case suffixes); `GB` is decimal."""
    assert parse_byte_size(text) == expected
    assert CacheConfig(kv_cache_memory_bytes=text).kv_cache_memory_bytes == expected


def test_defaults_follow_the_issue() -> None:
    mc, cc = ModelConfig(), CacheConfig()
    assert mc.model == "smollm2-135m" and cc.block_size == 16 and mc.quantization == "none"
    assert mc.dtype == "auto" and mc.device == "auto" and mc.max_model_len is None
    assert cc.kv_cache_dtype == "auto" and engine_knobs()["kv_cache_dtype"].search is None  # not tuned by default


@pytest.mark.parametrize(
    ("knobs", "named"),
    [
        ({"dtype": "float64"}, "dtype"),
        ({"device": "tpu"}, "device"),
        ({"model": ""}, "model"),
        ({"max_model_len": 0}, "max_model_len"),
        (
            {"quantization": "fp8", "device": "cuda"},
            r"quantization must be one of \('none', 'int8', 'int4'\), got 'fp8'",
        ),
        ({"quantization": "int4", "device": "cuda"}, "quantization='int4' runs on the CPU only"),
        ({"quantization_group_size": 48}, "quantization_group_size"),
        ({"quantization_skip": "lm_head,mlp"}, "quantization_skip"),
        ({"block_size": 0}, "block_size"),
        ({"block_size": 24}, "block_size"),
        ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"num_gpu_blocks_override": 0}, "num_gpu_blocks_override"),
        ({"kv_cache_memory_bytes": 0}, "kv_cache_memory_bytes must be a positive number of bytes"),
        ({"kv_cache_memory_bytes": -1}, "kv_cache_memory_bytes must be a positive number of bytes"),
        ({"kv_cache_memory_bytes": True}, "kv_cache_memory_bytes must be a positive number of bytes"),
        ({"kv_cache_memory_bytes": 1.5}, "kv_cache_memory_bytes must be a positive number of bytes"),
        ({"kv_cache_memory_bytes": "4 gigs"}, "kv_cache_memory_bytes: not a byte size: '4 gigs'"),
        ({"kv_cache_memory_bytes": "4g"}, "kv_cache_memory_bytes: not a byte size"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"max_num_batched_tokens": -1}, "max_num_batched_tokens"),
        ({"max_num_sequences": 4}, "max_num_sequences"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"cpu_threads": 0}, "cpu_threads"),
        ({"kv_cache_dtype": "float16"}, "kv_cache_dtype must be one of"),
        ({"kv_cache_dtype": "fp8", "device": "cuda"}, r"kv_cache_dtype must be one of \('auto', 'bfloat16'\)"),
    ],
)
def test_bad_knobs_are_config_errors_naming_the_knob(knobs: dict[str, object], named: str, tmp_path: Path) -> None:
    knobs = {"model": str(tmp_path / "no-such-model"), **knobs}  # checked before the model is looked at
    with pytest.raises(ConfigError, match=named):
        EngineConfig.from_kwargs(**knobs)


def test_tensor_parallel_size_must_split_the_heads_and_the_error_lists_the_valid_sizes() -> None:
    # the default model: 9 attention heads, 3 KV heads
    with pytest.raises(ConfigError, match=r"tensor_parallel_size=2 does not split .* 9 attention heads and 3 KV "
                                          r"heads; valid sizes: 1, 3, 9$"):  # fmt: skip
        EngineConfig.from_kwargs(model="smollm2-135m", tensor_parallel_size=2)
    config = EngineConfig.from_kwargs(model="tiny-random", tensor_parallel_size=4)  # 4 heads, 2 KV heads replicated
    assert config.parallel_config.tensor_parallel_size == 4


def test_valid_tensor_parallel_sizes_follow_vllm() -> None:
    assert valid_tensor_parallel_sizes(9, 3) == [1, 3, 9]
    assert valid_tensor_parallel_sizes(32, 8) == [1, 2, 4, 8, 16, 32]  # more ranks than KV heads: replicated
    assert valid_tensor_parallel_sizes(12, 4) == [1, 2, 4, 12]  # 3 and 6 neither divide 4 nor are multiples of it
    assert valid_tensor_parallel_sizes(14, 2) == [1, 2, 14]  # 7 is not a multiple of 2


def test_quantization_error_lists_the_valid_methods() -> None:
    with pytest.raises(ConfigError, match=r"quantization must be one of \('none', 'int8', 'int4'\), got 'int3'"):
        ModelConfig(quantization="int3")


def test_max_model_len_is_resolved_against_the_model_when_the_config_is_built(tmp_path: Path) -> None:
    context = model_context_length("tiny-random")
    assert EngineConfig.from_kwargs(model="tiny-random").model_config.max_model_len == context
    assert EngineConfig.from_kwargs(model="tiny-random", max_model_len=64).model_config.max_model_len == 64
    with pytest.raises(ConfigError, match=f"max_model_len={context + 1} exceeds the model's context length {context}"):
        EngineConfig.from_kwargs(model="tiny-random", max_model_len=context + 1)
    with pytest.raises(ModelNotFoundError):
        EngineConfig.from_kwargs(model=str(tmp_path / "missing"))
    # built directly, an unset max_model_len is read off the model too
    assert EngineConfig(ModelConfig(model="tiny-random")).model_config.max_model_len == context


def test_direct_construction_with_a_length_needs_no_model(tmp_path: Path) -> None:
    config = EngineConfig(ModelConfig(model=str(tmp_path / "none"), max_model_len=64), CacheConfig(), SchedulerConfig())
    assert config.model_config.max_model_len == 64


def test_chunked_prefill_off_needs_a_budget_of_max_model_len() -> None:
    no_chunking = SchedulerConfig(max_num_batched_tokens=64, enable_chunked_prefill=False)
    with pytest.raises(ConfigError, match="--enable-chunked-prefill"):
        EngineConfig(ModelConfig(max_model_len=256), CacheConfig(), no_chunking)
    with pytest.raises(ConfigError, match="max_num_batched_tokens"):
        EngineConfig.from_kwargs(model="tiny-random", max_num_batched_tokens=64, enable_chunked_prefill=False)
    chunking = SchedulerConfig(max_num_batched_tokens=64, enable_chunked_prefill=True)
    EngineConfig(ModelConfig(max_model_len=256), CacheConfig(), chunking)  # prompts can be split


def test_every_config_field_is_a_declared_knob() -> None:
    specs = engine_knobs()
    names = [f.name for cls in COMPONENTS.values() for f in dataclasses.fields(cls)]
    assert list(specs) == names
    for spec in specs.values():
        assert spec.help and spec.flag == "--" + spec.name.replace("_", "-")
        assert spec.value_type in (int, float, str, bool)
    assert specs["enable_prefix_caching"].flags == ("--enable-prefix-caching", "--no-enable-prefix-caching")
    assert specs["max_num_seqs"].component == "scheduler_config" and specs["quantization"].default == "none"


def test_knob_args_use_the_declared_flags() -> None:
    knobs = {"max_num_seqs": 8, "enable_prefix_caching": False, "enable_chunked_prefill": True, "dtype": None}
    assert knob_args(knobs) == ["--max-num-seqs", "8", "--no-enable-prefix-caching", "--enable-chunked-prefill"]
    with pytest.raises(ConfigError, match="unknown engine knob.*max_num_sequences.*max_num_seqs"):
        knob_args({"max_num_sequences": 8})


def test_fp8_kv_cache_is_refused_on_a_config_built_directly() -> None:
    with pytest.raises(ConfigError, match=r"kv_cache_dtype must be one of \('auto', 'bfloat16'\), got 'fp8'"):
        EngineConfig(ModelConfig(device="cpu", max_model_len=64), CacheConfig(kv_cache_dtype="fp8"))


def test_knob_parse_text_reads_each_kind_and_says_what_a_knob_takes() -> None:
    specs = engine_knobs()
    assert specs["quantization"].parse_text("int8") == "int8"
    assert specs["max_num_seqs"].parse_text("8") == 8 and specs["gpu_memory_utilization"].parse_text("0.5") == 0.5
    assert specs["enable_prefix_caching"].parse_text("False") is False
    for name, text, message in [
        ("quantization", "fp8", "'fp8' is not one of none, int8, int4"),
        ("max_num_seqs", "8.5", "'8.5' is not an integer"),
        ("gpu_memory_utilization", "half", "'half' is not a number"),
        ("enable_prefix_caching", "yes", "takes true or false, got 'yes'"),
    ]:
        with pytest.raises(ValueError, match=message):
            specs[name].parse_text(text)
