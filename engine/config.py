"""Engine configuration: one dataclass per component, vLLM's knob names, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")


class ConfigError(ValueError):
    """A knob has a value the engine cannot use; the message names the knob and the fix."""


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


@dataclass
class ModelConfig:
    model: str = "smollm2-135m"
    tokenizer: str | None = None
    dtype: str = "auto"
    max_model_len: int | None = None  # None: the model's own context length
    seed: int = 0
    device: str = "auto"

    def __post_init__(self) -> None:
        _check(bool(self.model), "model must be a non-empty alias, HF directory, hub id or .gguf path")
        _check(self.dtype in DTYPES, f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        _check(self.device in DEVICES, f"device must be one of {DEVICES}, got {self.device!r}")
        _check(
            self.max_model_len is None or self.max_model_len > 0,
            f"max_model_len must be positive, got {self.max_model_len}",
        )


@dataclass
class CacheConfig:
    block_size: int = 16
    # Fraction of device memory (on the CPU: of available RAM) for weights + activations + KV cache.
    gpu_memory_utilization: float = 0.9
    # Explicit KV-cache size in blocks; skips the memory-based sizing when set.
    num_gpu_blocks_override: int | None = None
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        _check(
            self.block_size > 0 and self.block_size & (self.block_size - 1) == 0,
            f"block_size must be a positive power of two, got {self.block_size}",
        )
        _check(
            0.0 < self.gpu_memory_utilization <= 1.0,
            f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}",
        )
        _check(
            self.num_gpu_blocks_override is None or self.num_gpu_blocks_override > 0,
            f"num_gpu_blocks_override must be positive, got {self.num_gpu_blocks_override}",
        )


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True

    def __post_init__(self) -> None:
        _check(self.max_num_seqs > 0, f"max_num_seqs must be positive, got {self.max_num_seqs}")
        _check(
            self.max_num_batched_tokens > 0,
            f"max_num_batched_tokens must be positive, got {self.max_num_batched_tokens}",
        )


@dataclass
class EngineConfig:
    model_config: ModelConfig = field(default_factory=ModelConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)

    @classmethod
    def from_kwargs(cls, **knobs: object) -> EngineConfig:
        """Build from flat vLLM-style keyword knobs (`max_num_seqs=8, dtype="float32", ...`)."""
        parts: dict[str, dict[str, object]] = {}
        for part_name, part_cls in (
            ("model_config", ModelConfig),
            ("cache_config", CacheConfig),
            ("scheduler_config", SchedulerConfig),
        ):
            names = {f.name for f in fields(part_cls)}
            parts[part_name] = {k: knobs.pop(k) for k in list(knobs) if k in names}
        if knobs:
            raise ConfigError(f"unknown engine knob(s): {', '.join(sorted(knobs))}")
        return cls(
            model_config=ModelConfig(**parts["model_config"]),  # type: ignore[arg-type]
            cache_config=CacheConfig(**parts["cache_config"]),  # type: ignore[arg-type]
            scheduler_config=SchedulerConfig(**parts["scheduler_config"]),  # type: ignore[arg-type]
        )

    def finalize(self, model_max_len: int) -> None:
        """Resolve max_model_len against the model and check the scheduler can serve it."""
        mc, sc = self.model_config, self.scheduler_config
        if mc.max_model_len is None:
            mc.max_model_len = model_max_len
        _check(
            mc.max_model_len <= model_max_len,
            f"max_model_len={mc.max_model_len} exceeds the model's context length {model_max_len}",
        )
        if not sc.enable_chunked_prefill:
            _check(
                sc.max_num_batched_tokens >= mc.max_model_len,
                f"max_num_batched_tokens ({sc.max_num_batched_tokens}) must be >= max_model_len "
                f"({mc.max_model_len}) when chunked prefill is off; raise it, lower max_model_len, "
                "or pass --enable-chunked-prefill",
            )
