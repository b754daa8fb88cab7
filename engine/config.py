"""Engine configuration: one dataclass per component, vLLM's knob names, validated on construction.

Every engine knob is one field declared with `knob(...)`: its default, its help text, its vLLM flag and (for
knobs `bench tune` searches by default) its search range live in the field. The `bench serve / throughput /
sweep` options (engine/cli_options.py), the flags a launched engine gets (sweep/launcher.py) and the tuner's
knob space (sweep/tune/space.py) are all generated from `engine_knobs()`, so a new field is a new knob
everywhere. A field typed as a `Literal` is a choice knob: the config accepts and --help lists only its values.
The checks are in engine/config_checks.py; the JSON knobs' parsed forms are their packages' (SpeculativeConfig in
engine/spec_decode/config.py, StructuredOutputsConfig in engine/structured_output/config.py), parsed once, by
EngineConfig.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from functools import cache
from typing import Any, Literal

from engine.config_checks import (
    QUANTIZATION_GROUP_SIZES,
    QUANTIZATION_SKIPPABLE,
    ConfigError,
    check_cache_config,
    check_engine_config,
    check_model_config,
    check_parallel_config,
    check_scheduler_config,
    literal_choices,
    model_context_length,
    parse_byte_size,
)
from engine.config_checks import check as _check
from engine.config_checks import check_tensor_parallel_size as check_tensor_parallel_size
from engine.config_checks import quantization_unsupported_reason as quantization_unsupported_reason
from engine.config_checks import resolved_device_type as resolved_device_type
from engine.spec_decode.config import SPECULATIVE_METHODS as SPECULATIVE_METHODS
from engine.spec_decode.config import SpeculativeConfig
from engine.structured_output.config import StructuredOutputsConfig

# The choices of the choice knobs: a field's Literal type is what the config checks and what --help lists.
Dtype = Literal["auto", "float32", "bfloat16", "float16"]
Device = Literal["auto", "cpu", "cuda"]
QuantizationMethod = Literal["none", "int8", "int4"]  # fp8: not implemented anywhere yet, so not offered
KVCacheDtype = Literal["auto", "bfloat16"]  # fp8: not implemented anywhere yet, so not offered
AttentionBackend = Literal["auto", "torch", "triton", "cpu"]  # engine.attention.ATTENTION_BACKENDS plus auto
DTYPES: tuple[str, ...] = typing.get_args(Dtype)
DEVICES: tuple[str, ...] = typing.get_args(Device)
QUANTIZATION_METHODS: tuple[str, ...] = typing.get_args(QuantizationMethod)
KV_CACHE_DTYPES: tuple[str, ...] = typing.get_args(KVCacheDtype)
ATTENTION_BACKENDS: tuple[str, ...] = typing.get_args(AttentionBackend)


@dataclass(frozen=True)
class SearchRange:
    """The values `bench tune` tries for a knob by default: on the CPU, and on a GPU (`cuda`, default: the same).

    With `fraction_of_model_len` the values are fractions of the model's context length (max_model_len).
    """

    cpu: tuple[Any, ...]
    cuda: tuple[Any, ...] | None = None
    fraction_of_model_len: bool = False


def knob(
    default: Any,
    *,
    help: str,
    flag: str | None = None,
    search: SearchRange | None = None,
    parse: Callable[[str], Any] | None = None,
) -> Any:
    """A config field that is an engine knob. `flag` defaults to `--` + the name with dashes; `parse` turns the
    flag's text into the value where the type's own parsing would not (`4GiB` for a byte count)."""
    return field(default=default, metadata={"help": help, "flag": flag, "search": search, "parse": parse})


@dataclass(frozen=True)
class KnobSpec:
    """One engine knob as the command lines see it, read off its config field."""

    name: str
    component: str  # the EngineConfig attribute that holds it: model_config, cache_config, scheduler_config
    value_type: type  # int, float, str or bool (an optional knob's non-None type)
    default: Any
    help: str
    flag: str
    search: SearchRange | None
    parse: Callable[[str], Any] | None = None  # the flag's text -> the value, where value_type(text) would not do
    choices: tuple[Any, ...] | None = None  # a Literal-typed knob's values (value_type: their type)

    @property
    def flags(self) -> tuple[str, ...]:
        """Every flag of the knob: booleans take vLLM's `--enable-x/--no-enable-x` pair."""
        return (self.flag, "--no-" + self.flag[2:]) if self.value_type is bool else (self.flag,)

    def args(self, value: Any) -> list[str]:
        """The command-line arguments that set the knob to `value` (`['--max-num-seqs', '8']`)."""
        if self.value_type is bool:
            return [self.flags[0] if value else self.flags[1]]
        return [self.flag, str(value)]

    def parse_text(self, text: str) -> Any:
        """A value as a command line spells it ('int8', '8', 'true') -> the knob's value; a ValueError says what the
        knob takes. The one parser behind `--vary KNOB=...` and `bench compare --target NAME=engine:KNOB=...`."""
        if self.parse is not None:
            return self.parse(text)
        if self.choices is not None:
            matching = [choice for choice in self.choices if str(choice) == text]
            if not matching:
                raise ValueError(f"{text!r} is not one of {', '.join(map(str, self.choices))}")
            return matching[0]
        if self.value_type is bool:
            if text.lower() not in ("true", "false"):
                raise ValueError(f"takes true or false, got {text!r}")
            return text.lower() == "true"
        if self.value_type in (int, float):
            try:
                return self.value_type(text)
            except ValueError:
                expected = "an integer" if self.value_type is int else "a number"
                raise ValueError(f"{text!r} is not {expected}") from None
        return text


@dataclass
class ModelConfig:
    model: str = knob("smollm2-135m", help="Model alias, HF directory, .gguf file or hub id.")
    tokenizer: str | None = knob(None, help="Tokenizer to use instead of the model's own.")
    dtype: Dtype = knob(
        "auto", help="Weight and activation dtype (auto: the checkpoint's on CUDA, float32 on the CPU)."
    )
    max_model_len: int | None = knob(
        None,
        help="Context length (default: the model's).",
        search=SearchRange(cpu=(0.25, 0.5, 1.0), fraction_of_model_len=True),
    )
    seed: int = knob(0, help="Engine seed.")
    device: Device = knob("auto", help="Where the model runs (auto: cuda when available, else cpu).")
    quantization: QuantizationMethod = knob("none", help="Weight quantization method (int4: CPU only).")
    quantization_group_size: int = knob(
        32,
        help="Input channels per scale group (int4 layers, the int8 LM head): "
        + " | ".join(map(str, QUANTIZATION_GROUP_SIZES)),
    )
    quantization_skip: str | None = knob(
        None, help="Comma-separated layers left unquantized: " + " | ".join(QUANTIZATION_SKIPPABLE)
    )
    attention_backend: AttentionBackend = knob(
        "auto",
        help="Paged attention kernels (auto: triton on CUDA, cpu on the CPU when its C++ kernel builds, else torch).",
    )
    enforce_eager: bool = knob(
        True,
        help="Run the forward eagerly (the default here, unlike vLLM's: on the CPU hosts measured, the compiled "
        "forward was no faster, docs/BENCHMARKS.md). --no-enforce-eager compiles each decoder layer's work outside "
        "attention with torch.compile (inductor) at start-up, cached in <SERVELAB_CACHE>/inductor; "
        "SERVELAB_ENFORCE_EAGER=1 in the environment keeps it eager even then.",
    )

    def __post_init__(self) -> None:
        check_model_config(self)

    @property
    def skipped_layers(self) -> tuple[str, ...]:
        """The layer names `quantization_skip` lists."""
        return tuple(name.strip() for name in (self.quantization_skip or "").split(",") if name.strip())


# The CPU's default KV cache (no kv_cache_memory_bytes): the smaller of these, split over the tensor-parallel ranks
# that share the RAM, so the engine never takes most of a shared machine (vLLM's CPU build: 4 GiB by default).
CPU_KV_CACHE_DEFAULT_BYTES = 4 * 2**30
CPU_KV_CACHE_DEFAULT_FRACTION = 0.25  # of MemAvailable before the weights load


@dataclass
class CacheConfig:
    enable_prefix_caching: bool = knob(
        True, help="Reuse KV blocks of shared prefixes.", search=SearchRange(cpu=(False, True))
    )
    block_size: int = knob(16, help="Tokens per KV block.", search=SearchRange(cpu=(8, 16, 32)))
    gpu_memory_utilization: float = knob(
        0.9,
        help="Memory fraction for weights + activations + KV cache (CUDA: of the GPU; CPU: of available RAM, "
        "where the KV cache also stays under its default cap, see --kv-cache-memory-bytes).",
        search=SearchRange(cpu=(0.7, 0.8, 0.9, 0.95)),
    )
    kv_cache_memory_bytes: int | None = knob(
        None,
        help="KV cache bytes per rank (4GiB, 4G or 4294967296); overrides --gpu-memory-utilization. Default on "
        f"the CPU: min({CPU_KV_CACHE_DEFAULT_BYTES // 2**30} GiB, {CPU_KV_CACHE_DEFAULT_FRACTION:.0%} of "
        "MemAvailable) over the ranks. vLLM's CPU build: VLLM_CPU_KVCACHE_SPACE=N (GiB) is NGiB here.",
        parse=parse_byte_size,
    )
    num_gpu_blocks_override: int | None = knob(None, help="KV-cache size in blocks (skips memory sizing).")
    kv_cache_dtype: KVCacheDtype = knob(
        "auto",
        help="Storage dtype of the paged KV cache (auto: the model dtype; bfloat16 halves a float32 model's KV "
        "bytes per block).",
    )

    def __post_init__(self) -> None:
        check_cache_config(self)


def _ngram_json(num_speculative_tokens: int) -> str:
    return json.dumps({"method": "ngram", "num_speculative_tokens": num_speculative_tokens})


@dataclass
class SchedulerConfig:
    max_num_seqs: int = knob(
        256,
        help="Most requests in one batch.",
        search=SearchRange(cpu=(2, 4, 8, 16, 32), cuda=(16, 32, 64, 128, 256, 512)),
    )
    max_num_batched_tokens: int = knob(
        2048,
        help="Token budget of one engine step.",
        search=SearchRange(cpu=(256, 512, 1024, 2048), cuda=(1024, 2048, 4096, 8192, 16384)),
    )
    enable_chunked_prefill: bool = knob(
        True, help="Split long prompts across steps.", search=SearchRange(cpu=(False, True))
    )
    inject_step_delay_ms: float = knob(
        0.0,
        help="Benchmarking aid, never for serving: spin this long in every step that runs the model, to check "
        "that `bench gate` catches a known slow-down (docs/GATE.md).",
    )
    speculative_config: str | None = knob(
        None,
        help='Speculative decoding as vLLM\'s JSON, e.g. {"method": "ngram", "num_speculative_tokens": 4} or '
        '{"method": "draft_model", "model": "tiny-random", "num_speculative_tokens": 3} (default: off).',
        search=SearchRange(cpu=(None, *(_ngram_json(k) for k in (2, 4, 6)))),
    )

    structured_outputs_config: str | None = knob(
        None,
        help='Structured-outputs defaults for every request, as vLLM\'s JSON, e.g. {"disable_any_whitespace": true} '
        "(compact JSON outputs); fields: backend (auto | xgrammar), disable_any_whitespace, disable_fallback, "
        "disable_additional_properties (docs/SERVER.md).",
    )

    def __post_init__(self) -> None:
        """The JSON knobs stay JSON text (the flag's form; LLM(...) may pass a dict or the config object);
        EngineConfig parses them, once."""
        self.speculative_config = SpeculativeConfig.to_json(self.speculative_config)
        self.structured_outputs_config = StructuredOutputsConfig.to_json(self.structured_outputs_config)
        check_scheduler_config(self)


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = knob(
        1,
        help="Tensor-parallel ranks: one worker process per rank, each holding its shard of the model.",
        search=SearchRange(cpu=(1, 2), cuda=(1, 2, 4, 8)),
    )
    cpu_threads: int | None = knob(
        None, help="Torch CPU threads per tensor-parallel rank (default: this machine's cores / the ranks)."
    )

    def __post_init__(self) -> None:
        check_parallel_config(self)


COMPONENTS: dict[str, type] = {
    "model_config": ModelConfig,
    "cache_config": CacheConfig,
    "scheduler_config": SchedulerConfig,
    "parallel_config": ParallelConfig,
}


def _knob_type(annotation: Any, choices: tuple[Any, ...] | None) -> type:
    if choices is not None:
        (base,) = {type(choice) for choice in choices}
        return base
    options = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    (base,) = options
    return base


@cache
def engine_knobs() -> dict[str, KnobSpec]:
    """Every engine knob by name, in declaration order (model, cache, scheduler, parallel)."""
    specs: dict[str, KnobSpec] = {}
    for component, cls in COMPONENTS.items():
        hints, choices = typing.get_type_hints(cls), literal_choices(cls)
        for f in fields(cls):
            specs[f.name] = KnobSpec(
                name=f.name,
                component=component,
                value_type=_knob_type(hints[f.name], choices.get(f.name)),
                default=None if f.default is MISSING else f.default,
                help=f.metadata["help"],
                flag=f.metadata["flag"] or "--" + f.name.replace("_", "-"),
                search=f.metadata["search"],
                parse=f.metadata["parse"],
                choices=choices.get(f.name),
            )
    return specs


def knob_args(knobs: dict[str, Any]) -> list[str]:
    """{'max_num_seqs': 8, 'enable_prefix_caching': False} -> ['--max-num-seqs', '8', '--no-enable-prefix-caching'].

    Knobs set to None (the engine default) give no flag; a name that is not an engine knob is a ConfigError.
    """
    specs = _known_knob_specs(knobs)
    return [arg for name, value in knobs.items() if value is not None for arg in specs[name].args(value)]


def _known_knob_specs(knobs: dict[str, Any]) -> dict[str, KnobSpec]:
    """`engine_knobs()`, after checking that every name in `knobs` is one (a ConfigError listing them if not)."""
    specs = engine_knobs()
    if unknown := sorted(set(knobs) - set(specs)):
        raise ConfigError(f"unknown engine knob(s): {', '.join(unknown)}; the engine has {', '.join(specs)}")
    return specs


@dataclass
class EngineConfig:
    """The engine's whole configuration. After construction `model_config.max_model_len` is an int.

    `from_kwargs`, which every entry point uses, reads the model's context length: it fills max_model_len when
    unset and rejects a longer one. Built directly, the config reads the model only when max_model_len is unset
    (so tests can build one for a scheduler without any model).
    """

    model_config: ModelConfig = field(default_factory=ModelConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    speculative_config: SpeculativeConfig | None = field(init=False, default=None)  # parsed from the knob
    structured_outputs_config: StructuredOutputsConfig = field(init=False)  # parsed from the knob

    def __post_init__(self) -> None:
        mc, sc = self.model_config, self.scheduler_config
        self.speculative_config = SpeculativeConfig.from_json(sc.speculative_config)  # the one parse of each
        self.structured_outputs_config = StructuredOutputsConfig.from_json(sc.structured_outputs_config)
        if mc.max_model_len is None:
            mc.max_model_len = model_context_length(mc.model)
        check_engine_config(self)

    @classmethod
    def from_kwargs(cls, **knobs: Any) -> EngineConfig:
        """Build from flat vLLM-style keyword knobs (`max_num_seqs=8, dtype="float32", ...`).

        Every component's knobs are validated before the model is looked at; then max_model_len is resolved
        against it, and the EngineConfig parses the JSON knobs and checks a draft model against the target.
        """
        specs = _known_knob_specs(knobs)
        parts = {
            component: cls_(**{k: v for k, v in knobs.items() if specs[k].component == component})
            for component, cls_ in COMPONENTS.items()
        }
        mc: ModelConfig = parts["model_config"]
        context_length = model_context_length(mc.model)
        if mc.max_model_len is None:
            mc.max_model_len = context_length
        _check(
            mc.max_model_len <= context_length,
            f"max_model_len={mc.max_model_len} exceeds the model's context length {context_length}",
        )
        config = cls(**parts)
        speculative = config.speculative_config
        if speculative is not None and speculative.method == "draft_model":
            speculative.check_draft_model(mc.model, mc.max_model_len)
        return config
