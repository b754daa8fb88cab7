"""Finding and converting checkpoints (engine.model_files): aliases, GGUF, HF directories, hub ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from engine.model_files import (
    TINY_RANDOM_CONFIG,
    ModelNotFoundError,
    gguf_to_hf,
    materialize_random_model,
    materialize_tiny_random,
    random_state_dict,
    resolve_model,
    reverse_rope_permute,
    smollm2_gguf_path,
)


def llama_cpp_permute(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """llama.cpp's convert_hf_to_gguf permutation of Q/K rows (HF rotate-half -> interleaved pairs)."""
    rows = weight.shape[0]
    return weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


@pytest.mark.parametrize("num_heads", [1, 3, 9])
def testreverse_rope_permute_undoes_llama_cpp(num_heads: int) -> None:
    weight = torch.randn(num_heads * 8, 5)
    permuted = llama_cpp_permute(weight, num_heads)
    assert not torch.equal(permuted, weight)
    assert torch.equal(reverse_rope_permute(permuted, num_heads), weight)


def test_tiny_random_is_an_hf_directory_with_smollm2_tokenizer() -> None:
    path = materialize_tiny_random()
    assert resolve_model("tiny-random") == path
    config = json.loads((path / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["vocab_size"] == 49152
    assert (path / "model.safetensors").is_file() and (path / "tokenizer_config.json").is_file()
    tensors = load_file(path / "model.safetensors")
    expected = random_state_dict(TINY_RANDOM_CONFIG, seed=1234)
    assert set(tensors) == set(expected)
    assert all(torch.equal(tensors[name], expected[name]) for name in expected)


def test_random_checkpoint_is_reproducible(tmp_path: Path) -> None:
    config = dict(TINY_RANDOM_CONFIG, vocab_size=64)
    a = load_file(materialize_random_model(tmp_path / "a", config, seed=5, tokenizer_name=None) / "model.safetensors")
    b = load_file(materialize_random_model(tmp_path / "b", config, seed=5, tokenizer_name=None) / "model.safetensors")
    c = random_state_dict(config, seed=6)
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


def test_gguf_metadata_becomes_an_hf_config() -> None:
    config, tensors = gguf_to_hf(smollm2_gguf_path())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_key_value_heads"]) == (30, 576, 3)
    assert config["tie_word_embeddings"] is True and config["rope_theta"] == 100000.0
    name, first = next(tensors)
    assert name == "model.embed_tokens.weight" and first.shape == (49152, 576) and first.dtype == torch.float32


def test_missing_gguf_file(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_model(str(tmp_path / "nope.gguf"))


def test_directory_with_only_pickled_weights_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(TINY_RANDOM_CONFIG))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(ModelNotFoundError, match="pickles are never loaded"):
        resolve_model(str(tmp_path))


def test_unknown_hub_id_offline_says_how_to_get_a_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match="alias"):
        resolve_model("no-such-org/no-such-model")


def test_unsupported_architecture_is_named(tmp_path: Path) -> None:
    config = dict(TINY_RANDOM_CONFIG, architectures=["GPT2LMHeadModel"])
    with pytest.raises(ValueError, match="GPT2LMHeadModel is not supported"):
        materialize_random_model(tmp_path / "gpt2", config, seed=0, tokenizer_name=None)
