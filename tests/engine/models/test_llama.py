"""Native Llama/Qwen2/Mistral forward logits against HF transformers in float32."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.config import EngineConfig
from engine.model_files import TINY_RANDOM_CONFIG, materialize_random_model, smollm2_gguf_path
from engine.model_runner import ModelRunner


def our_logits(model: str, input_ids: list[int]) -> torch.Tensor:
    """All-position logits of one sequence through our model (fresh prefill, no KV cache)."""
    runner = ModelRunner(EngineConfig.from_kwargs(model=model, dtype="float32"))
    n = len(input_ids)
    metadata = runner.attn_backend.build_metadata(
        [n], [n], [[0] * -(-n // runner.block_size)], torch.full((n,), -1), torch.device("cpu")
    )
    with torch.inference_mode():
        hidden = runner.model(torch.tensor(input_ids), torch.arange(n), runner.attn_backend, metadata)
        return runner.model.compute_logits(hidden)


def hf_logits(model: AutoModelForCausalLM, input_ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([input_ids])).logits[0]


def tiny_config(**overrides: Any) -> dict[str, Any]:
    config = dict(TINY_RANDOM_CONFIG, vocab_size=512, max_position_embeddings=256)
    config.update(overrides)
    return config


def prompt(n: int, vocab: int, seed: int = 0) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_tiny_random_matches_hf() -> None:
    from engine.model_files import materialize_tiny_random

    path = materialize_tiny_random()
    ids = prompt(40, TINY_RANDOM_CONFIG["vocab_size"])
    reference = hf_logits(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), ids)
    torch.testing.assert_close(our_logits("tiny-random", ids), reference, atol=1e-4, rtol=1e-4)


ARCHITECTURES = {
    "qwen2_bias_tied": tiny_config(
        architectures=["Qwen2ForCausalLM"], model_type="qwen2", tie_word_embeddings=True, use_sliding_window=False
    ),
    "mistral": tiny_config(architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=4096),
    "llama_rope_llama3": tiny_config(
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        }
    ),
    "llama_rope_linear": tiny_config(rope_scaling={"rope_type": "linear", "factor": 4.0}),
    "llama_mha_attention_and_mlp_bias": tiny_config(num_key_value_heads=4, attention_bias=True, mlp_bias=True),
}


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_seeded_tiny_checkpoints_match_hf(name: str, tmp_path: Path) -> None:
    path = materialize_random_model(tmp_path / name, ARCHITECTURES[name], seed=3, tokenizer_name=None)
    ids = prompt(48, 512, seed=1)
    reference = hf_logits(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), ids)
    torch.testing.assert_close(our_logits(str(path), ids), reference, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("scaling", ["llama_rope_llama3", "llama_rope_linear"])
def test_rope_scaling_changes_the_output(scaling: str, tmp_path: Path) -> None:
    """Guards the comparison above: a scaled checkpoint must differ from the same weights unscaled."""
    scaled = materialize_random_model(tmp_path / "scaled", ARCHITECTURES[scaling], seed=3, tokenizer_name=None)
    plain = materialize_random_model(tmp_path / "plain", tiny_config(), seed=3, tokenizer_name=None)
    ids = prompt(48, 512, seed=1)
    assert (our_logits(str(scaled), ids) - our_logits(str(plain), ids)).abs().max() > 1e-2


@pytest.mark.slow
def test_smollm2_gguf_matches_transformers_gguf_loading() -> None:
    """Our GGUF dequantisation + Q/K un-permutation against transformers' own GGUF loader."""
    from safetensors.torch import load_file
    from transformers import AutoConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from engine.model_files import resolve_model

    gguf = smollm2_gguf_path()
    reference_model = AutoModelForCausalLM.from_config(
        AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name), dtype=torch.float32
    ).eval()
    reference = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=reference_model)["tensors"]
    ours = load_file(resolve_model("smollm2-135m") / "model.safetensors")
    assert set(ours) == set(reference)
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.29.self_attn.k_proj.weight"):
        torch.testing.assert_close(ours[name], reference[name], atol=0, rtol=0)
    reference_model.load_state_dict(reference, strict=False)
    reference_model.tie_weights()
    ids = prompt(24, 49152, seed=2)
    torch.testing.assert_close(our_logits("smollm2-135m", ids), hf_logits(reference_model, ids), atol=2e-4, rtol=1e-4)
