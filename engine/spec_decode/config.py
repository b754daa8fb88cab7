"""The parsed `speculative_config` knob (SpeculativeConfig), with vLLM's field names and defaults.

The knob is vLLM's JSON text (the flag's value); EngineConfig parses it once into `EngineConfig.speculative_config`.
This module imports neither torch nor the rest of the package.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, fields
from typing import Any, Literal

from engine.config_checks import ConfigError, check

SpeculativeMethod = Literal["ngram", "draft_model"]
SPECULATIVE_METHODS: tuple[str, ...] = typing.get_args(SpeculativeMethod)


@dataclass(frozen=True)
class SpeculativeConfig:
    """`ngram` proposes the tokens that followed the last earlier occurrence of the request's final n tokens
    (n from prompt_lookup_max down to prompt_lookup_min); `draft_model` runs `model`, a smaller model with the
    target's vocabulary, for num_speculative_tokens tokens ahead.
    """

    method: SpeculativeMethod
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
        check(isinstance(data, dict), f"speculative_config must be a JSON object, got {raw!r}")
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(names))
        check(not unknown, f"speculative_config: unknown field(s) {unknown}; the fields are {names}")
        method = data.get("method") or ("draft_model" if data.get("model") else None)
        check(
            method in SPECULATIVE_METHODS,
            f"speculative_config.method must be one of {SPECULATIVE_METHODS}, got {data.get('method')!r}",
        )
        k = data.get("num_speculative_tokens")
        check(
            isinstance(k, int) and not isinstance(k, bool) and k >= 1,
            f"speculative_config.num_speculative_tokens must be an integer >= 1, got {k!r}",
        )
        lookup_max, lookup_min = data.get("prompt_lookup_max"), data.get("prompt_lookup_min")
        if method == "ngram":
            check(data.get("model") is None, "speculative_config.model is for method draft_model, not ngram")
            lookup_max, lookup_min = lookup_max or lookup_min or 5, lookup_min or lookup_max or 5
            check(
                isinstance(lookup_min, int) and isinstance(lookup_max, int) and 1 <= lookup_min <= lookup_max,
                f"speculative_config.prompt_lookup_min ({lookup_min}) must be >= 1 and <= prompt_lookup_max "
                f"({lookup_max})",
            )
        else:
            check(
                isinstance(data.get("model"), str) and bool(data["model"]),
                "speculative_config.model must name the draft model (an alias, HF directory or hub id)",
            )
            check(
                lookup_max is None and lookup_min is None,
                "speculative_config.prompt_lookup_max/min are for method ngram, not draft_model",
            )
        return cls(method, k, data.get("model"), lookup_max, lookup_min)

    @staticmethod
    def to_json(value: str | dict[str, Any] | SpeculativeConfig | None) -> str | None:
        """The knob's JSON text from what `LLM(speculative_config=...)` takes: JSON, a dict or this class."""
        if isinstance(value, SpeculativeConfig):
            return json.dumps({k: v for k, v in dataclasses.asdict(value).items() if v is not None})
        if isinstance(value, dict):
            return json.dumps(value)
        check(
            value is None or isinstance(value, str),
            f"speculative_config must be JSON text, a dict or a SpeculativeConfig, got {type(value).__name__}",
        )
        return value

    def check_draft_model(self, target_model: str, max_model_len: int) -> None:
        """A draft model must share the target's vocabulary and hold max_model_len + its lookahead tokens."""
        from engine.model_files import load_hf_config, resolve_model
        from engine.models.arch_config import ArchConfig

        assert self.model is not None
        draft = ArchConfig.from_hf(load_hf_config(resolve_model(self.model)))
        target = ArchConfig.from_hf(load_hf_config(resolve_model(target_model)))
        check(
            draft.vocab_size == target.vocab_size,
            f"speculative_config.model {self.model!r} has a vocabulary of {draft.vocab_size} tokens, the target "
            f"{target_model!r} {target.vocab_size}: a draft model must share the target's tokenizer",
        )
        needed = max_model_len + self.num_speculative_tokens
        check(
            draft.max_model_len >= needed,
            f"speculative_config.model {self.model!r} has a context length of {draft.max_model_len}, fewer than "
            f"max_model_len ({max_model_len}) + num_speculative_tokens ({self.num_speculative_tokens}); lower "
            "max_model_len or use another draft",
        )
