"""Engine configs: vLLM's knob names reach the right dataclass; every bad value is a ConfigError naming the knob."""

from __future__ import annotations

import pytest

from engine.config import ConfigError, EngineConfig


def test_flat_knobs_land_in_their_component() -> None:
    config = EngineConfig.from_kwargs(
        model="tiny-random", tokenizer="smollm2-135m", dtype="bfloat16", max_model_len=128, seed=3, device="cpu",
        block_size=32, gpu_memory_utilization=0.5, num_gpu_blocks_override=40, enable_prefix_caching=False,
        max_num_seqs=4, max_num_batched_tokens=64, enable_chunked_prefill=False,
    )  # fmt: skip
    mc, cc, sc = config.model_config, config.cache_config, config.scheduler_config
    assert (mc.model, mc.tokenizer, mc.dtype, mc.max_model_len, mc.seed, mc.device) == (
        "tiny-random", "smollm2-135m", "bfloat16", 128, 3, "cpu",
    )  # fmt: skip
    assert (cc.block_size, cc.gpu_memory_utilization, cc.num_gpu_blocks_override, cc.enable_prefix_caching) == (
        32, 0.5, 40, False,
    )  # fmt: skip
    assert (sc.max_num_seqs, sc.max_num_batched_tokens, sc.enable_chunked_prefill) == (4, 64, False)


def test_defaults_follow_the_issue() -> None:
    config = EngineConfig.from_kwargs()
    assert config.model_config.model == "smollm2-135m" and config.cache_config.block_size == 16
    assert config.model_config.dtype == "auto" and config.model_config.device == "auto"


@pytest.mark.parametrize(
    ("knobs", "named"),
    [
        ({"dtype": "float64"}, "dtype"),
        ({"device": "tpu"}, "device"),
        ({"model": ""}, "model"),
        ({"max_model_len": 0}, "max_model_len"),
        ({"block_size": 0}, "block_size"),
        ({"block_size": 24}, "block_size"),
        ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"num_gpu_blocks_override": 0}, "num_gpu_blocks_override"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"max_num_batched_tokens": -1}, "max_num_batched_tokens"),
        ({"max_num_sequences": 4}, "max_num_sequences"),
    ],
)
def test_bad_knobs_are_config_errors_naming_the_knob(knobs: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        EngineConfig.from_kwargs(**knobs)


def test_finalize_resolves_max_model_len_and_checks_the_budget() -> None:
    config = EngineConfig.from_kwargs()
    config.finalize(model_max_len=2048)
    assert config.model_config.max_model_len == 2048
    with pytest.raises(ConfigError, match="context length 512"):
        EngineConfig.from_kwargs(max_model_len=1024).finalize(model_max_len=512)
    no_chunking = EngineConfig.from_kwargs(max_model_len=256, max_num_batched_tokens=64, enable_chunked_prefill=False)
    with pytest.raises(ConfigError, match="--enable-chunked-prefill"):
        no_chunking.finalize(model_max_len=512)
    chunking = EngineConfig.from_kwargs(max_model_len=256, max_num_batched_tokens=64, enable_chunked_prefill=True)
    chunking.finalize(model_max_len=512)  # a small budget is fine when prompts can be split
