"""Engine configuration: one dataclass per component, vLLM's knob names, validated on construction.

Every engine knob is one field declared with `knob(...)`: its default, its help text, its vLLM flag and (for
knobs `bench tune` searches by default) its search range live in the field. The `bench serve / throughput /
sweep` options (engine/cli_options.py), the flags a launched engine gets (sweep/launcher.py) and the tuner's
knob space (sweep/tune/space.py) are all generated from `engine_knobs()`, so a new field is a new knob
everywhere.
"""

from __future__ import annotations

import json
import re
import typing
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.structured_output.config import StructuredOutputsConfig

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
QUANTIZATION_METHODS = ("none", "int8", "int4")  # fp8: not implemented anywhere yet, so not offered
QUANTIZATION_GROUP_SIZES = (32, 64, 128)
QUANTIZATION_SKIPPABLE = ("lm_head", "embed_tokens")
KV_CACHE_DTYPES = ("auto", "bfloat16")  # fp8: not implemented anywhere yet, so not offered
ATTENTION_BACKENDS = ("auto", "torch", "triton")  # engine.attention.ATTENTION_BACKENDS plus auto
SPECULATIVE_METHODS = ("ngram", "draft_model")


class ConfigError(ValueError):
    """A knob has a value the engine cannot use; the message names the knob and the fix."""


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


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

    @property
    def flags(self) -> tuple[str, ...]:
        """Every flag of the knob: booleans take vLLM's `--enable-x/--no-enable-x` pair."""
        return (self.flag, "--no-" + self.flag[2:]) if self.value_type is bool else (self.flag,)

    def args(self, value: Any) -> list[str]:
        """The command-line arguments that set the knob to `value` (`['--max-num-seqs', '8']`)."""
        if self.value_type is bool:
            return [self.flags[0] if value else self.flags[1]]
        return [self.flag, str(value)]


@dataclass
class ModelConfig:
    model: str = knob("smollm2-135m", help="Model alias, HF directory, .gguf file or hub id.")
    tokenizer: str | None = knob(None, help="Tokenizer to use instead of the model's own.")
    dtype: str = knob("auto", help=" | ".join(DTYPES))
    max_model_len: int | None = knob(
        None,
        help="Context length (default: the model's).",
        search=SearchRange(cpu=(0.25, 0.5, 1.0), fraction_of_model_len=True),
    )
    seed: int = knob(0, help="Engine seed.")
    device: str = knob("auto", help=" | ".join(DEVICES))
    quantization: str = knob("none", help="Weight quantization method: " + " | ".join(QUANTIZATION_METHODS))
    quantization_group_size: int = knob(
        32,
        help="Input channels per scale group (int4 layers, the int8 LM head): "
        + " | ".join(map(str, QUANTIZATION_GROUP_SIZES)),
    )
    quantization_skip: str | None = knob(
        None, help="Comma-separated layers left unquantized: " + " | ".join(QUANTIZATION_SKIPPABLE)
    )
    attention_backend: str = knob(
        "auto",
        help="Paged attention kernels: " + " | ".join(ATTENTION_BACKENDS) + " (auto: triton on CUDA, else torch).",
    )

    def __post_init__(self) -> None:
        _check(bool(self.model), "model must be a non-empty alias, HF directory, hub id or .gguf path")
        _check(self.dtype in DTYPES, f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        _check(self.device in DEVICES, f"device must be one of {DEVICES}, got {self.device!r}")
        _check(
            self.max_model_len is None or self.max_model_len > 0,
            f"max_model_len must be positive, got {self.max_model_len}",
        )
        _check(
            self.quantization in QUANTIZATION_METHODS,
            f"quantization must be one of {QUANTIZATION_METHODS}, got {self.quantization!r}",
        )
        _check(
            self.attention_backend in ATTENTION_BACKENDS,
            f"attention_backend must be one of {ATTENTION_BACKENDS}, got {self.attention_backend!r}",
        )
        _check(
            self.quantization_group_size in QUANTIZATION_GROUP_SIZES,
            f"quantization_group_size must be one of {QUANTIZATION_GROUP_SIZES}, got {self.quantization_group_size}",
        )
        unknown = sorted(set(self.skipped_layers) - set(QUANTIZATION_SKIPPABLE))
        _check(
            not unknown,
            f"quantization_skip names {unknown}; it takes a comma-separated subset of {QUANTIZATION_SKIPPABLE}",
        )
        reason = quantization_unsupported_reason(self.quantization, resolved_device_type(self.device))
        _check(reason is None, reason or "")

    @property
    def skipped_layers(self) -> tuple[str, ...]:
        """The layer names `quantization_skip` lists."""
        return tuple(name.strip() for name in (self.quantization_skip or "").split(",") if name.strip())


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


# The CPU's default KV cache (no kv_cache_memory_bytes): the smaller of these, split over the tensor-parallel ranks
# that share the RAM, so the engine never takes most of a shared machine (vLLM's CPU build: 4 GiB by default).
CPU_KV_CACHE_DEFAULT_BYTES = 4 * 2**30
CPU_KV_CACHE_DEFAULT_FRACTION = 0.25  # of MemAvailable before the weights load
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
    kv_cache_dtype: str = knob(
        "auto",
        help="Storage dtype of the paged KV cache: " + " | ".join(KV_CACHE_DTYPES) + " (auto: the model dtype; "
        "bfloat16 halves a float32 model's KV bytes per block).",
    )

    def __post_init__(self) -> None:
        _check(
            self.kv_cache_dtype in KV_CACHE_DTYPES,
            f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}",
        )
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
        if isinstance(self.kv_cache_memory_bytes, str):  # from a flag's or a JSON file's text
            try:
                self.kv_cache_memory_bytes = parse_byte_size(self.kv_cache_memory_bytes)
            except ValueError as error:
                raise ConfigError(f"kv_cache_memory_bytes: {error}") from None
        _check(
            self.kv_cache_memory_bytes is None
            or (type(self.kv_cache_memory_bytes) is int and self.kv_cache_memory_bytes > 0),
            f"kv_cache_memory_bytes must be a positive number of bytes, got {self.kv_cache_memory_bytes!r}",
        )


def _ngram_json(num_speculative_tokens: int) -> str:
    return json.dumps({"method": "ngram", "num_speculative_tokens": num_speculative_tokens})


@dataclass(frozen=True)
class SpeculativeConfig:
    """The parsed `speculative_config` knob, with vLLM's field names and defaults.

    `ngram` proposes the tokens that followed the last earlier occurrence of the request's final n tokens
    (n from prompt_lookup_max down to prompt_lookup_min); `draft_model` runs `model`, a smaller model with the
    target's vocabulary, for num_speculative_tokens tokens ahead.
    """

    method: str
    num_speculative_tokens: int
    model: str | None = None
    prompt_lookup_max: int | None = None
    prompt_lookup_min: int | None = None

    @classmethod
    def from_json(cls, raw: str | None) -> SpeculativeConfig | None:
        """None (speculation off) for no config; a ConfigError naming the field for a bad one."""
        if raw is None:
            return None
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as error:
            raise ConfigError(f"speculative_config is not valid JSON ({error}): {raw!r}") from None
        _check(isinstance(data, dict), f"speculative_config must be a JSON object, got {raw!r}")
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(names))
        _check(not unknown, f"speculative_config: unknown field(s) {unknown}; the fields are {names}")
        method = data.get("method") or ("draft_model" if data.get("model") else None)
        _check(
            method in SPECULATIVE_METHODS,
            f"speculative_config.method must be one of {SPECULATIVE_METHODS}, got {data.get('method')!r}",
        )
        k = data.get("num_speculative_tokens")
        _check(
            isinstance(k, int) and not isinstance(k, bool) and k >= 1,
            f"speculative_config.num_speculative_tokens must be an integer >= 1, got {k!r}",
        )
        lookup_max, lookup_min = data.get("prompt_lookup_max"), data.get("prompt_lookup_min")
        if method == "ngram":
            _check(data.get("model") is None, "speculative_config.model is for method draft_model, not ngram")
            lookup_max, lookup_min = lookup_max or lookup_min or 5, lookup_min or lookup_max or 5
            _check(
                isinstance(lookup_min, int) and isinstance(lookup_max, int) and 1 <= lookup_min <= lookup_max,
                f"speculative_config.prompt_lookup_min ({lookup_min}) must be >= 1 and <= prompt_lookup_max "
                f"({lookup_max})",
            )
        else:
            _check(
                isinstance(data.get("model"), str) and bool(data["model"]),
                "speculative_config.model must name the draft model (an alias, HF directory or hub id)",
            )
            _check(
                lookup_max is None and lookup_min is None,
                "speculative_config.prompt_lookup_max/min are for method ngram, not draft_model",
            )
        return cls(method, k, data.get("model"), lookup_max, lookup_min)

    def check_draft_model(self, target_model: str, max_model_len: int) -> None:
        """A draft model must share the target's vocabulary and hold max_model_len + its lookahead tokens."""
        from engine.model_files import load_hf_config, resolve_model
        from engine.models.arch_config import ArchConfig

        assert self.model is not None
        draft = ArchConfig.from_hf(load_hf_config(resolve_model(self.model)))
        target = ArchConfig.from_hf(load_hf_config(resolve_model(target_model)))
        _check(
            draft.vocab_size == target.vocab_size,
            f"speculative_config.model {self.model!r} has a vocabulary of {draft.vocab_size} tokens, the target "
            f"{target_model!r} {target.vocab_size}: a draft model must share the target's tokenizer",
        )
        needed = max_model_len + self.num_speculative_tokens
        _check(
            draft.max_model_len >= needed,
            f"speculative_config.model {self.model!r} has a context length of {draft.max_model_len}, fewer than "
            f"max_model_len ({max_model_len}) + num_speculative_tokens ({self.num_speculative_tokens}); lower "
            "max_model_len or use another draft",
        )


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
        if isinstance(self.speculative_config, dict):  # LLM(speculative_config={...}) passes the dict itself
            self.speculative_config = json.dumps(self.speculative_config)
        SpeculativeConfig.from_json(self.speculative_config)  # a bad config fails here, naming its field
        from engine.structured_output.config import StructuredOutputsConfig

        self.structured_outputs_config = StructuredOutputsConfig.to_json(self.structured_outputs_config)
        StructuredOutputsConfig.from_json(self.structured_outputs_config)  # likewise
        _check(self.max_num_seqs > 0, f"max_num_seqs must be positive, got {self.max_num_seqs}")
        _check(
            self.max_num_batched_tokens > 0,
            f"max_num_batched_tokens must be positive, got {self.max_num_batched_tokens}",
        )
        _check(
            self.inject_step_delay_ms >= 0,
            f"inject_step_delay_ms must be >= 0, got {self.inject_step_delay_ms}",
        )


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
        _check(
            self.tensor_parallel_size > 0,
            f"tensor_parallel_size must be positive, got {self.tensor_parallel_size}",
        )
        _check(
            self.cpu_threads is None or self.cpu_threads > 0, f"cpu_threads must be positive, got {self.cpu_threads}"
        )


COMPONENTS: dict[str, type] = {
    "model_config": ModelConfig,
    "cache_config": CacheConfig,
    "scheduler_config": SchedulerConfig,
    "parallel_config": ParallelConfig,
}


def _knob_type(annotation: Any) -> type:
    options = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    (base,) = options
    return base


@cache
def engine_knobs() -> dict[str, KnobSpec]:
    """Every engine knob by name, in declaration order (model, cache, scheduler, parallel)."""
    specs: dict[str, KnobSpec] = {}
    for component, cls in COMPONENTS.items():
        hints = typing.get_type_hints(cls)
        for f in fields(cls):
            specs[f.name] = KnobSpec(
                name=f.name,
                component=component,
                value_type=_knob_type(hints[f.name]),
                default=None if f.default is MISSING else f.default,
                help=f.metadata["help"],
                flag=f.metadata["flag"] or "--" + f.name.replace("_", "-"),
                search=f.metadata["search"],
                parse=f.metadata["parse"],
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
    _check(
        tensor_parallel_size in valid,
        f"tensor_parallel_size={tensor_parallel_size} does not split {model}'s {arch.num_attention_heads} attention "
        f"heads and {arch.num_key_value_heads} KV heads; valid sizes: {', '.join(map(str, valid))}",
    )


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
        self.speculative_config = SpeculativeConfig.from_json(sc.speculative_config)
        from engine.structured_output.config import StructuredOutputsConfig

        self.structured_outputs_config = StructuredOutputsConfig.from_json(sc.structured_outputs_config)
        if mc.max_model_len is None:
            mc.max_model_len = model_context_length(mc.model)
        if self.parallel_config.tensor_parallel_size > 1:
            check_tensor_parallel_size(mc.model, self.parallel_config.tensor_parallel_size)
        if not sc.enable_chunked_prefill:
            _check(
                sc.max_num_batched_tokens >= mc.max_model_len,
                f"max_num_batched_tokens ({sc.max_num_batched_tokens}) must be >= max_model_len "
                f"({mc.max_model_len}) when chunked prefill is off; raise it, lower max_model_len, "
                "or pass --enable-chunked-prefill",
            )

    @classmethod
    def from_kwargs(cls, **knobs: Any) -> EngineConfig:
        """Build from flat vLLM-style keyword knobs (`max_num_seqs=8, dtype="float32", ...`).

        Every knob is validated before the model is looked at; then max_model_len is resolved against it.
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
        speculative = SpeculativeConfig.from_json(parts["scheduler_config"].speculative_config)
        if speculative is not None and speculative.method == "draft_model":
            speculative.check_draft_model(mc.model, mc.max_model_len)
        return cls(**parts)
