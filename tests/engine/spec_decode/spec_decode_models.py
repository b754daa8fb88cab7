"""Models for the speculative-decoding tests (the fixture that writes them is in conftest.py): a 16-token-vocabulary
target, so prompt lookup finds n-grams and a chi-square over outputs has few cells, and a draft made of the target's
weights plus noise (it agrees with the target often, not always)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.model_files import TINY_RANDOM_CONFIG

SMALL_VOCAB_CONFIG = {**TINY_RANDOM_CONFIG, "vocab_size": 16, "bos_token_id": 1, "eos_token_id": 2}


@dataclass(frozen=True)
class SmallVocabModels:
    target: str
    draft: str
