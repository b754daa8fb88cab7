"""`bench tune --max-quality-loss`: a configuration whose perplexity rises more than the bound over the unquantized
model is infeasible, known before its engine is launched.

Quality depends only on the knobs that change the numbers the model computes with (`QUALITY_KNOBS`: the weight
knobs, with the dtype they are stored in, and the KV cache's dtype), so it is measured once per such setting, in this
process, with `bench check quality`'s `measure_quality` (the setting against the same knobs with quantization=none and
kv_cache_dtype=auto), and cached in the study's user attributes under `quality:<setting JSON>`: a resumed study, and
every worker sharing its storage, reads it instead of measuring again. quantization=none with kv_cache_dtype=auto is
the reference itself: a loss of 0, never measured.

The text is prefilled in chunks of `chunk_tokens` (`--max-num-batched-tokens`), well below the window: a window's
first chunk attends over its fresh K/V, so only later chunks read the cache and see its dtype's cost.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import optuna

from sweep.tune.objective import Infeasible

WEIGHT_KNOBS = ("dtype", "quantization", "quantization_group_size", "quantization_skip")
QUALITY_KNOBS = (*WEIGHT_KNOBS, "kv_cache_dtype")
CACHE_PREFIX = "quality:"
FLAG = "--max-quality-loss"

Measure = Callable[[dict[str, Any]], dict[str, Any]]


def parse_max_quality_loss(text: str) -> float:
    """'2%' or '0.02' -> 0.02: the largest allowed perplexity increase over the unquantized model, as a fraction."""
    raw = text.strip()
    percent = raw.endswith("%")
    try:
        value = float(raw[:-1] if percent else raw)
    except ValueError:
        raise ValueError(f"{FLAG} takes a percentage like 2% or a fraction like 0.02, got {text!r}") from None
    if value != value or value < 0:  # NaN or negative
        raise ValueError(f"{FLAG} must be >= 0, got {text!r}")
    if percent:
        return value / 100
    if value > 1:
        raise ValueError(f"{FLAG} {text!r} as a fraction is over 100 %; write {raw}% for a percentage")
    return value


@dataclass
class QualityGuardConfig:
    model: str
    max_loss: float  # the largest allowed perplexity / reference_perplexity - 1
    window: int = 1024  # `bench check quality --window`
    num_tokens: int | None = None  # `bench check quality --num-tokens` (None: the whole text)
    chunk_tokens: int = 64  # `bench check quality --max-num-batched-tokens`: below the window, so the KV cache is read

    def __post_init__(self) -> None:
        if self.max_loss < 0:
            raise ValueError(f"{FLAG} must be >= 0, got {self.max_loss}")
        if self.window < 2:
            raise ValueError(f"--quality-window must be >= 2 tokens, got {self.window}")
        if self.num_tokens is not None and self.num_tokens < 2:
            raise ValueError(f"--quality-tokens must be >= 2, got {self.num_tokens}")
        if self.chunk_tokens < 1:
            raise ValueError(f"the quality chunk must be >= 1 token, got {self.chunk_tokens}")


def quality_setting(knobs: dict[str, Any]) -> dict[str, Any]:
    """The trial knobs quality depends on (only those the trial sets; the engine defaults stand for the rest):
    always `quantization` and `kv_cache_dtype`, the group size and skip list only when quantized."""
    setting = {k: knobs[k] for k in QUALITY_KNOBS if knobs.get(k) is not None}
    setting.setdefault("quantization", "none")
    setting.setdefault("kv_cache_dtype", "auto")
    if setting["quantization"] == "none":
        return {k: v for k, v in setting.items() if k in ("dtype", "quantization", "kv_cache_dtype")}
    return setting


def is_reference(setting: dict[str, Any]) -> bool:
    """The setting `measure_quality` compares against: its loss is 0 by definition."""
    return setting["quantization"] == "none" and setting["kv_cache_dtype"] == "auto"


def cache_key(config: QualityGuardConfig, setting: dict[str, Any]) -> str:
    measured_on = {"model": config.model, "window": config.window, "num_tokens": config.num_tokens,
                   "chunk_tokens": config.chunk_tokens}
    return CACHE_PREFIX + json.dumps({**measured_on, **setting}, sort_keys=True)


def measure_in_process(config: QualityGuardConfig) -> Measure:
    """`measure_quality` on the engine in this process, its memory released before the trial's engine starts."""

    def measure(setting: dict[str, Any]) -> dict[str, Any]:
        from engine.benchmarks.quality import measure_quality
        from engine.config import ConfigError

        try:
            result = measure_quality({**setting, "model": config.model}, window=config.window,
                                     num_tokens=config.num_tokens, max_num_batched_tokens=config.chunk_tokens)
        except ConfigError as err:  # the engine refuses the setting: so would the trial's engine
            raise Infeasible(f"quality measurement: {err}", "start") from err
        finally:
            gc.collect()
            _empty_cuda_cache()
        return asdict(result)

    return measure


def _empty_cuda_cache() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


class QualityGuard:
    """Per trial: the setting's cached (or now measured) perplexity increase, and whether it breaks the bound."""

    def __init__(self, config: QualityGuardConfig, measure: Measure | None = None) -> None:
        self.config = config
        self.measure = measure or measure_in_process(config)

    def quality(self, study: optuna.Study, knobs: dict[str, Any]) -> dict[str, Any]:
        """The setting's quality record: `perplexity_increase` and, once measured, `bench check quality`'s other
        fields."""
        setting = quality_setting(knobs)
        if is_reference(setting):
            return {"perplexity_increase": 0.0, "setting": setting}
        key = cache_key(self.config, setting)
        cached = study.user_attrs.get(key)
        if cached is not None:
            return cached
        record = {**self.measure(setting), "setting": setting}
        study.set_user_attr(key, record)
        return record

    def violation(self, record: dict[str, Any]) -> str | None:
        """Why the record breaks the bound, or None when it does not."""
        loss = record["perplexity_increase"]
        if loss <= self.config.max_loss:
            return None
        return (f"perplexity {100 * loss:+.2f} % over the unquantized model exceeds {FLAG} "
                f"{100 * self.config.max_loss:.2f} % ({json.dumps(record['setting'], sort_keys=True)})")
