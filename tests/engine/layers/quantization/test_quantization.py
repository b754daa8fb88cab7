"""The quantization registry and the `none` method (dense weights, oneDNN-prepacked on the CPU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine import config
from engine.layers.linear import ReplicatedLinear
from engine.layers.onednn import onednn_linear_available
from engine.layers.quantization import QUANTIZATION_METHODS, UnquantizedLinearMethod, get_linear_method
from engine.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

needs_onednn = pytest.mark.skipif(not onednn_linear_available(torch.float32), reason="no oneDNN linear here")
torch.manual_seed(0)
X = torch.randn(5, 64)


def test_the_knob_accepts_exactly_the_registered_methods() -> None:
    assert set(config.QUANTIZATION_METHODS) == set(QUANTIZATION_METHODS)


def test_unknown_quantization_lists_the_available_ones() -> None:
    with pytest.raises(ValueError, match="unknown quantization 'int3'; available: none, int8, int4"):
        get_linear_method("int3", torch.device("cpu"), torch.float32)


def test_none_prepacks_for_onednn_only_on_a_cpu_that_supports_it() -> None:
    cpu = get_linear_method("none", torch.device("cpu"), torch.float32)
    assert isinstance(cpu, UnquantizedLinearMethod)
    assert cpu.prepack_onednn == onednn_linear_available(torch.float32)
    assert not UnquantizedLinearMethod.for_device(torch.device("cuda"), torch.float32).prepack_onednn


def test_without_prepacking_the_weight_stays_dense_and_the_matmul_is_f_linear() -> None:
    weight, bias = torch.randn(48, 64), torch.randn(48)
    layer = ReplicatedLinear(64, 48, True, torch.float32, quant_method=UnquantizedLinearMethod())
    layer.weight_loader(layer.weight, weight)
    layer.weight_loader(layer.bias, bias)
    layer.quant_method.process_weights_after_loading(layer)
    assert torch.equal(layer.weight, weight)
    assert torch.equal(layer(X), F.linear(X, weight, bias))


@needs_onednn
def test_prepacked_linear_matches_f_linear_and_frees_the_dense_weight() -> None:
    weight, bias = torch.randn(48, 64), torch.randn(48)
    layer = ReplicatedLinear(64, 48, True, torch.float32, quant_method=UnquantizedLinearMethod(prepack_onednn=True))
    layer.weight_loader(layer.weight, weight)
    layer.weight_loader(layer.bias, bias)
    layer.quant_method.process_weights_after_loading(layer)
    assert layer.weight.numel() == 0
    torch.testing.assert_close(layer(X), F.linear(X, weight, bias), atol=1e-5, rtol=1e-5)


@needs_onednn
def test_prepacked_tied_lm_head_leaves_the_embedding_its_dense_weight() -> None:
    table = torch.randn(48, 64)
    embedding = VocabParallelEmbedding(48, 64, torch.float32)
    lm_head = ParallelLMHead(48, 64, torch.float32, quant_method=UnquantizedLinearMethod(prepack_onednn=True))
    lm_head.tie_weights(embedding)
    embedding.weight_loader(embedding.weight, table)
    lm_head.quant_method.process_weights_after_loading(lm_head)
    assert torch.equal(embedding.weight, table)
    ids = torch.tensor([3, 0, 47])
    assert torch.equal(embedding(ids), table[ids])
    torch.testing.assert_close(lm_head(X), F.linear(X, table), atol=1e-5, rtol=1e-5)
