"""The engine config's validation: the ConfigError, the per-component checks and the checks that read the model.

engine/config.py declares the knobs; each component's `__post_init__` calls its check here. A knob whose type is a
`Literal` is checked against the literal's values, so the choices are written once, on the field. The checks that
read a model's config.json (its context length, its heads for tensor parallelism) import the model code only when
they run, so importing this module loads no torch.
"""

from __future__ import annotations

import re
import typing
from dataclasses import fields
from functools import cache
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from engine.config import CacheConfig, EngineConfig, ModelConfig, ParallelConfig, SchedulerConfig


class ConfigError(ValueError):
    """A knob has a value the engine cannot use; the message names the knob and the fix."""


def check(condition: bool, message: str) -> None:
    """A ConfigError with `message` unless `condition` holds."""
    if not condition:
        raise ConfigError(message)


@cache
def literal_choices(cls: type) -> dict[str, tuple[Any, ...]]:
    """The fields of dataclass `cls` typed as a `Literal` (or an optional one), with the literal's values."""
    hints = typing.get_type_hints(cls)
    choices: dict[str, tuple[Any, ...]] = {}
    for f in fields(cls):
        options = [a for a in typing.get_args(hints[f.name]) if a is not type(None)]
        literal = hints[f.name] if typing.get_origin(hints[f.name]) is Literal else None
        if literal is None and len(options) == 1 and typing.get_origin(options[0]) is Literal:
            literal = options[0]
        if literal is not None:
            choices[f.name] = typing.get_args(literal)
    return choices


def check_choices(config: Any) -> None:
    """Every `Literal`-typed field of the dataclass `config` holds one of its values."""
    for name, values in literal_choices(type(config)).items():
        value = getattr(config, name)
        check(value is None or value in values, f"{name} must be one of {values}, got {value!r}")


QUANTIZATION_GROUP_SIZES = (32, 64, 128)
QUANTIZATION_SKIPPABLE = ("lm_head", "embed_tokens")


def check_model_config(mc: ModelConfig) -> None:
    check(bool(mc.model), "model must be a non-empty alias, HF directory, hub id or .gguf path")
    check_choices(mc)
    check(mc.max_model_len is None or mc.max_model_len > 0, f"max_model_len must be positive, got {mc.max_model_len}")
    check(
        mc.quantization_group_size in QUANTIZATION_GROUP_SIZES,
        f"quantization_group_size must be one of {QUANTIZATION_GROUP_SIZES}, got {mc.quantization_group_size}",
    )
    unknown = sorted(set(mc.skipped_layers) - set(QUANTIZATION_SKIPPABLE))
    check(
        not unknown,
        f"quantization_skip names {unknown}; it takes a comma-separated subset of {QUANTIZATION_SKIPPABLE}",
    )
    reason = quantization_unsupported_reason(mc.quantization, resolved_device_type(mc.device))
    check(reason is None, reason or "")
    check(
        mc.attention_backend != "cpu" or resolved_device_type(mc.device) == "cpu",
        "attention_backend='cpu' runs on the CPU only (a C++ kernel over CPU tensors); on cuda use triton or torch",
    )


def resolved_device_type(device: str) -> str:
    """'cuda' or 'cpu': what `device` (auto|cpu|cuda) runs on here."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def quantization_unsupported_reason(quantization: str, device_type: str) -> str | None:
    """Why the engine cannot run `quantization` on `device_type`, or None when it can."""
    if quantization == "int4" and device_type != "cpu":
        return (
            f"quantization='int4' runs on the CPU only (torch's packed int4 CPU kernel); on {device_type} use "
            "--quantization int8"
        )
    return None


_BYTE_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40,  # as vLLM's `1K`, `4G`: binary
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "KB": 10**3, "MB": 10**6, "GB": 10**9,
               "TB": 10**12}  # fmt: skip
_BYTE_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")


def parse_byte_size(text: str) -> int:
    """`4294967296`, `4GiB`, `4G` (binary, as vLLM's `4G`), `4GB` (decimal) or `1.5GiB` -> bytes; ValueError if not."""
    match = _BYTE_SIZE.fullmatch(text)
    unit = match.group(2) if match else ""
    if match is None or (unit.upper() not in _BYTE_UNITS) or (len(unit) == 1 and unit.islower()):
        raise ValueError(
            f"not a byte size: {text!r}; give bytes (4294967296) or a number with KiB/MiB/GiB/TiB, K/M/G/T "
            "(the same, binary) or KB/MB/GB/TB (decimal)"
        )
    return int(float(match.group(1)) * _BYTE_UNITS[unit.upper()])


def check_cache_config(cc: CacheConfig) -> None:
    """Also turns a byte-size text in kv_cache_memory_bytes (from a flag or a JSON file) into its int."""
    check_choices(cc)
    check(
        cc.block_size > 0 and cc.block_size & (cc.block_size - 1) == 0,
        f"block_size must be a positive power of two, got {cc.block_size}",
    )
    check(
        0.0 < cc.gpu_memory_utilization <= 1.0,
        f"gpu_memory_utilization must be in (0, 1], got {cc.gpu_memory_utilization}",
    )
    check(
        cc.num_gpu_blocks_override is None or cc.num_gpu_blocks_override > 0,
        f"num_gpu_blocks_override must be positive, got {cc.num_gpu_blocks_override}",
    )
    if isinstance(cc.kv_cache_memory_bytes, str):
        try:
            cc.kv_cache_memory_bytes = parse_byte_size(cc.kv_cache_memory_bytes)
        except ValueError as error:
            raise ConfigError(f"kv_cache_memory_bytes: {error}") from None
    check(
        cc.kv_cache_memory_bytes is None or (type(cc.kv_cache_memory_bytes) is int and cc.kv_cache_memory_bytes > 0),
        f"kv_cache_memory_bytes must be a positive number of bytes, got {cc.kv_cache_memory_bytes!r}",
    )


def check_scheduler_config(sc: SchedulerConfig) -> None:
    check(sc.max_num_seqs > 0, f"max_num_seqs must be positive, got {sc.max_num_seqs}")
    check(sc.max_num_batched_tokens > 0, f"max_num_batched_tokens must be positive, got {sc.max_num_batched_tokens}")
    check(sc.inject_step_delay_ms >= 0, f"inject_step_delay_ms must be >= 0, got {sc.inject_step_delay_ms}")


def check_parallel_config(pc: ParallelConfig) -> None:
    check(pc.tensor_parallel_size > 0, f"tensor_parallel_size must be positive, got {pc.tensor_parallel_size}")
    check(pc.cpu_threads is None or pc.cpu_threads > 0, f"cpu_threads must be positive, got {pc.cpu_threads}")


def check_engine_config(config: EngineConfig) -> None:
    """The rules across components, once max_model_len is resolved."""
    mc, sc = config.model_config, config.scheduler_config
    assert mc.max_model_len is not None
    if config.parallel_config.tensor_parallel_size > 1:
        check_tensor_parallel_size(mc.model, config.parallel_config.tensor_parallel_size)
    if not sc.enable_chunked_prefill:
        check(
            sc.max_num_batched_tokens >= mc.max_model_len,
            f"max_num_batched_tokens ({sc.max_num_batched_tokens}) must be >= max_model_len "
            f"({mc.max_model_len}) when chunked prefill is off; raise it, lower max_model_len, "
            "or pass --enable-chunked-prefill",
        )


def model_context_length(model: str) -> int:
    """The model's own context length, from its config.json (ModelNotFoundError when there is no such model)."""
    from engine.model_files import load_hf_config, resolve_model
    from engine.models.arch_config import ArchConfig

    return ArchConfig.from_hf(load_hf_config(resolve_model(model))).max_model_len


def check_tensor_parallel_size(model: str, tensor_parallel_size: int) -> None:
    """vLLM's rule: the size divides the attention heads, and divides or is a multiple of the KV heads."""
    from engine.distributed import valid_tensor_parallel_sizes
    from engine.model_files import load_hf_config, resolve_model
    from engine.models.arch_config import ArchConfig

    arch = ArchConfig.from_hf(load_hf_config(resolve_model(model)))
    valid = valid_tensor_parallel_sizes(arch.num_attention_heads, arch.num_key_value_heads)
    check(
        tensor_parallel_size in valid,
        f"tensor_parallel_size={tensor_parallel_size} does not split {model}'s {arch.num_attention_heads} attention "
        f"heads and {arch.num_key_value_heads} KV heads; valid sizes: {', '.join(map(str, valid))}",
    )
