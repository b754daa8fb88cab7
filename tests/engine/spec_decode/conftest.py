"""Models for the speculative-decoding tests: a 16-token-vocabulary target, so prompt lookup finds n-grams and a
chi-square over outputs has few cells, and a draft made of the target's weights plus noise (it agrees with the
target often, not always)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from engine.model_files import TINY_RANDOM_CONFIG, random_state_dict, write_hf_checkpoint

SMALL_VOCAB_CONFIG = {**TINY_RANDOM_CONFIG, "vocab_size": 16, "bos_token_id": 1, "eos_token_id": 2}


@dataclass(frozen=True)
class SmallVocabModels:
    target: str
    draft: str


@pytest.fixture(scope="session")
def small_vocab_models(tmp_path_factory: pytest.TempPathFactory) -> SmallVocabModels:
    root = tmp_path_factory.mktemp("small-vocab")
    weights = random_state_dict(SMALL_VOCAB_CONFIG, seed=11)
    write_hf_checkpoint(root / "target", SMALL_VOCAB_CONFIG, weights, "tiny-random")
    generator = torch.Generator().manual_seed(12)
    noisy = {name: w + 0.3 * w.std() * torch.randn(w.shape, generator=generator) for name, w in weights.items()}
    write_hf_checkpoint(root / "draft", SMALL_VOCAB_CONFIG, noisy, "tiny-random")
    return SmallVocabModels(str(root / "target"), str(root / "draft"))
