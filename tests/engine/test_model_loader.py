"""Building the native model (engine.model_loader): the class, the weights, the linear method's preparation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.layers.linear import LinearBase
from engine.layers.onednn import onednn_linear_available
from engine.layers.quantization import UnquantizedLinearMethod
from engine.layers.vocab_parallel_embedding import ParallelLMHead
from engine.model_files import TINY_RANDOM_CONFIG, materialize_random_model, materialize_tiny_random
from engine.model_loader import load_model

CPU = torch.device("cpu")


def small_checkpoint(path: Path, **overrides: object) -> Path:
    return materialize_random_model(path, dict(TINY_RANDOM_CONFIG, vocab_size=64, **overrides), 5, None)


def test_load_model_casts_to_the_requested_dtype() -> None:
    model, arch, path = load_model("tiny-random", torch.bfloat16, CPU)
    assert arch.num_hidden_layers == 2 and path == materialize_tiny_random()
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert not model.training


def test_every_linear_layer_and_the_lm_head_share_one_method_from_the_factory() -> None:
    model, _, _ = load_model("tiny-random", torch.float32, CPU, quantization="none")
    layers = [m for m in model.modules() if isinstance(m, (LinearBase, ParallelLMHead))]
    assert len(layers) == 2 * 4 + 1  # qkv, o, gate_up, down per layer + the LM head
    methods = {id(m.quant_method) for m in layers}
    assert len(methods) == 1 and isinstance(model.lm_head.quant_method, UnquantizedLinearMethod)
    assert model.lm_head.quant_method.prepack_onednn == onednn_linear_available(torch.float32)


def test_the_lm_head_computes_the_checkpoint_logits(tmp_path: Path) -> None:
    path = small_checkpoint(tmp_path / "m")
    model, _, _ = load_model(str(path), torch.float32, CPU)
    lm_head = load_file(path / "model.safetensors")["lm_head.weight"]
    hidden = torch.randn(3, TINY_RANDOM_CONFIG["hidden_size"])
    with torch.inference_mode():
        torch.testing.assert_close(model.compute_logits(hidden), hidden @ lm_head.T, atol=1e-5, rtol=1e-5)


def test_a_tied_lm_head_reads_the_embedding(tmp_path: Path) -> None:
    path = small_checkpoint(tmp_path / "tied", tie_word_embeddings=True)
    model, _, _ = load_model(str(path), torch.float32, CPU)
    embedding = load_file(path / "model.safetensors")["model.embed_tokens.weight"]
    assert torch.equal(model.embed_tokens.weight, embedding)  # prepacking the head keeps the dense table
    hidden = torch.randn(3, TINY_RANDOM_CONFIG["hidden_size"])
    with torch.inference_mode():
        torch.testing.assert_close(model.compute_logits(hidden), hidden @ embedding.T, atol=1e-5, rtol=1e-5)


def test_unknown_quantization_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown quantization 'awq'; available: none, int8, int4"):
        load_model("tiny-random", torch.float32, CPU, quantization="awq")


def test_checkpoint_missing_a_tensor_is_refused(tmp_path: Path) -> None:
    path = small_checkpoint(tmp_path / "m")
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing 1 tensor\(s\), e.g. \['layers.1.mlp.gate_up_proj.weight:1'\]"):
        load_model(str(path), torch.float32, CPU)


def test_checkpoint_with_an_unknown_tensor_is_refused(tmp_path: Path) -> None:
    path = small_checkpoint(tmp_path / "m")
    tensors = load_file(path / "model.safetensors")
    tensors["model.layers.0.self_attn.extra.weight"] = torch.zeros(2)
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match="unexpected checkpoint tensor 'model.layers.0.self_attn.extra.weight'"):
        load_model(str(path), torch.float32, CPU)
