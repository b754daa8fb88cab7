"""The small-vocabulary target and draft checkpoints of the speculative-decoding tests (spec_decode_models.py)."""

from __future__ import annotations

import pytest
import torch
from spec_decode_models import SMALL_VOCAB_CONFIG, SmallVocabModels

from engine.model_files import random_state_dict, write_hf_checkpoint


@pytest.fixture(scope="session")
def small_vocab_models(tmp_path_factory: pytest.TempPathFactory) -> SmallVocabModels:
    root = tmp_path_factory.mktemp("small-vocab")
    weights = random_state_dict(SMALL_VOCAB_CONFIG, seed=11)
    write_hf_checkpoint(root / "target", SMALL_VOCAB_CONFIG, weights, "tiny-random")
    generator = torch.Generator().manual_seed(12)
    noisy = {name: w + 0.3 * w.std() * torch.randn(w.shape, generator=generator) for name, w in weights.items()}
    write_hf_checkpoint(root / "draft", SMALL_VOCAB_CONFIG, noisy, "tiny-random")
    return SmallVocabModels(str(root / "target"), str(root / "draft"))
