"""The speculative_config knob: vLLM's JSON shape, defaults, and a ConfigError naming the field for bad configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from spec_decode_models import SMALL_VOCAB_CONFIG, SmallVocabModels

from engine.config import ConfigError, EngineConfig, SchedulerConfig, SpeculativeConfig
from engine.model_files import random_state_dict, write_hf_checkpoint


def test_parses_vllms_shape_with_its_defaults() -> None:
    assert SpeculativeConfig.from_json(None) is None
    ngram = SpeculativeConfig.from_json('{"method": "ngram", "num_speculative_tokens": 4}')
    assert ngram == SpeculativeConfig("ngram", 4, None, 5, 5)
    assert SpeculativeConfig.from_json('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}') == (
        SpeculativeConfig("ngram", 2, None, 3, 3)
    )
    draft = SpeculativeConfig.from_json('{"model": "tiny-random", "num_speculative_tokens": 3}')
    assert draft == SpeculativeConfig("draft_model", 3, "tiny-random")
    assert SchedulerConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 1}).speculative_config == (  # type: ignore[arg-type]
        '{"method": "ngram", "num_speculative_tokens": 1}'
    )  # a dict (LLM(speculative_config={...})) becomes the JSON the flag takes


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ('{"method": "eagle", "num_speculative_tokens": 2}', "speculative_config.method"),
        ('{"method": "ngram", "num_speculative_tokens": 0}', "speculative_config.num_speculative_tokens"),
        ('{"method": "ngram"}', "speculative_config.num_speculative_tokens"),
        ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}',
         "speculative_config.prompt_lookup_min"),
        ('{"method": "draft_model", "num_speculative_tokens": 2}', "speculative_config.model"),
        ('{"method": "ngram", "num_speculative_tokens": 2, "depth": 3}', "unknown field(s) ['depth']"),
        ('{"method": "ngram", ', "speculative_config is not valid JSON"),
        ("[1, 2]", "speculative_config must be a JSON object"),
    ],
)  # fmt: skip
def test_bad_configs_name_the_field(raw: str, field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        EngineConfig.from_kwargs(model="tiny-random", speculative_config=raw)


def test_a_draft_must_share_the_vocabulary_and_hold_the_context(
    small_vocab_models: SmallVocabModels, tmp_path: Path
) -> None:
    other_vocab = json.dumps({"method": "draft_model", "model": "tiny-random", "num_speculative_tokens": 2})
    with pytest.raises(ConfigError, match="speculative_config.model 'tiny-random' has a vocabulary of 49152"):
        EngineConfig.from_kwargs(model=small_vocab_models.target, speculative_config=other_vocab)
    short = {**SMALL_VOCAB_CONFIG, "max_position_embeddings": 64}
    write_hf_checkpoint(tmp_path / "short", short, random_state_dict(short, 1), "tiny-random")
    too_short = json.dumps({"method": "draft_model", "model": str(tmp_path / "short"), "num_speculative_tokens": 4})
    with pytest.raises(ConfigError, match=r"context length of 64, fewer than max_model_len \(62\) \+"):
        EngineConfig.from_kwargs(model=small_vocab_models.target, max_model_len=62, speculative_config=too_short)
    EngineConfig.from_kwargs(model=small_vocab_models.target, max_model_len=60, speculative_config=too_short)


def test_the_knob_text_from_json_a_dict_or_the_config() -> None:
    ngram = SpeculativeConfig("ngram", 2, None, 3, 3)
    assert SpeculativeConfig.from_json(SpeculativeConfig.to_json(ngram)) == ngram
    assert SpeculativeConfig.to_json({"method": "ngram", "num_speculative_tokens": 2}) == (
        '{"method": "ngram", "num_speculative_tokens": 2}'
    )
    with pytest.raises(ConfigError, match="speculative_config must be JSON text, a dict or a SpeculativeConfig"):
        SpeculativeConfig.to_json(3)  # type: ignore[arg-type]
