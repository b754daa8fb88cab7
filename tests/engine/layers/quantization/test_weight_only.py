"""int8 and int4 weight-only methods against their dequantised float references, on random weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.config import ConfigError
from engine.layers.linear import MergedColumnParallelLinear, ReplicatedLinear
from engine.layers.quantization import (
    Int4LinearMethod,
    Int8EmbeddingMethod,
    Int8GroupedLinearMethod,
    Int8LinearMethod,
    get_linear_method,
)
from engine.layers.quantization.quant_utils import (
    dequantize_int4,
    dequantize_int8,
    dequantize_int8_groupwise,
    quantize_int4_groupwise,
    quantize_int8_groupwise,
    quantize_int8_per_channel,
    split_int8_into_int4_pair,
)
from engine.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

CPU = torch.device("cpu")
GENERATOR = torch.Generator().manual_seed(0)
WEIGHT = torch.randn(48, 128, generator=GENERATOR)
BIAS = torch.randn(48, generator=GENERATOR)
X = torch.randn(5, 128, generator=GENERATOR)


def bf16_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """What a bfloat16-activation kernel computes over the dequantised weight, in float32."""
    return F.linear(x.to(torch.bfloat16).float(), weight, bias)


def loaded_layer(method: object, weight: torch.Tensor = WEIGHT, bias: torch.Tensor | None = BIAS) -> ReplicatedLinear:
    layer = ReplicatedLinear(weight.shape[1], weight.shape[0], bias is not None, torch.float32, quant_method=method)
    layer.weight_loader(layer.weight, weight)
    if bias is not None:
        layer.weight_loader(layer.bias, bias)
    layer.quant_method.process_weights_after_loading(layer)
    return layer


def test_int8_quantizer_rounds_each_weight_to_the_nearest_step_of_its_row() -> None:
    q, scale = quantize_int8_per_channel(WEIGHT)
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127
    torch.testing.assert_close(scale, WEIGHT.abs().amax(dim=1) / 127)
    assert bool(((dequantize_int8(q, scale) - WEIGHT).abs() <= scale[:, None] / 2 + 1e-7).all())


def test_int4_quantizer_stays_within_half_a_step_of_each_group() -> None:
    q, scale, zero = quantize_int4_groupwise(WEIGHT, 32)
    assert q.shape == WEIGHT.shape and scale.shape == (48, 4) and int(q.min()) >= 0 and int(q.max()) <= 15
    error = (dequantize_int4(q, scale, zero) - WEIGHT).view(48, 4, 32).abs().amax(dim=-1)
    assert bool((error <= scale.float() * 0.5 + 1e-2 * scale.float()).all())


@pytest.mark.parametrize("use_cpu_kernel", [True, False], ids=["cpu-kernel", "torch-ops"])
def test_int8_linear_equals_the_dequantised_reference(use_cpu_kernel: bool) -> None:
    layer = loaded_layer(Int8LinearMethod(use_cpu_kernel))
    assert layer.weight.numel() == 0 and layer.weight_int8.dtype == torch.int8
    q, scale = quantize_int8_per_channel(WEIGHT)
    if use_cpu_kernel:  # bfloat16 activations, scales and output
        reference = bf16_reference(X, q.float() * scale.to(torch.bfloat16).float()[:, None], BIAS)
        torch.testing.assert_close(layer(X), reference, atol=0.05, rtol=0.01)
    else:
        torch.testing.assert_close(layer(X), F.linear(X, dequantize_int8(q, scale), BIAS), atol=1e-5, rtol=1e-5)
    assert layer(X).dtype == torch.float32


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_int4_linear_equals_the_dequantised_reference(group_size: int) -> None:
    layer = loaded_layer(Int4LinearMethod(group_size))
    assert layer.weight.numel() == 0 and layer.weight_int4pack.dtype == torch.uint8
    reference = bf16_reference(X, dequantize_int4(*quantize_int4_groupwise(WEIGHT, group_size)), BIAS)
    torch.testing.assert_close(layer(X), reference, atol=0.05, rtol=0.01)


def test_int4_packed_blocks_load_without_requantising() -> None:
    q = torch.randint(0, 16, (48, 128), generator=GENERATOR, dtype=torch.int32)
    scale = torch.rand(48, 4, generator=GENERATOR).to(torch.bfloat16)
    zero = torch.randn(48, 4, generator=GENERATOR).to(torch.bfloat16)
    method = Int4LinearMethod(32)
    layer = ReplicatedLinear(128, 48, False, torch.float32, quant_method=method)
    method.load_packed(layer, q, scale, zero)
    method.process_weights_after_loading(layer)  # keeps the packed blocks
    torch.testing.assert_close(layer(X), bf16_reference(X, dequantize_int4(q, scale, zero), None), atol=0.05, rtol=0.01)


def test_a_fused_projection_quantizes_after_both_shards_load() -> None:
    gate, up = torch.randn(32, 64, generator=GENERATOR), torch.randn(16, 64, generator=GENERATOR)
    layer = MergedColumnParallelLinear(64, [32, 16], False, torch.float32, quant_method=Int8LinearMethod(False))
    layer.weight_loader(layer.weight, gate, 0)
    layer.weight_loader(layer.weight, up, 1)
    layer.quant_method.process_weights_after_loading(layer)
    x = X[:, :64]
    expected = F.linear(x, dequantize_int8(*quantize_int8_per_channel(torch.cat([gate, up]))))
    torch.testing.assert_close(layer(x), expected)


def test_tied_lm_head_and_int8_embedding_each_get_their_own_quantized_copy() -> None:
    table = torch.randn(64, 32, generator=GENERATOR)
    embedding = VocabParallelEmbedding(64, 32, torch.float32)
    embedding.weight_loader(embedding.weight, table)
    head = ParallelLMHead(64, 32, torch.float32, quant_method=Int8LinearMethod(True))
    head.tie_weights(embedding)
    embedding.embedding_method = Int8EmbeddingMethod()
    head.quant_method.process_weights_after_loading(head)
    embedding.embedding_method.process_weights_after_loading(embedding)
    ids = torch.tensor([3, 0, 63, 3])
    expected_rows = dequantize_int8(*quantize_int8_per_channel(table))[ids]
    assert torch.equal(embedding(ids), expected_rows)
    assert embedding.weight.numel() == 0 and head.weight.numel() == 0
    h = torch.randn(2, 32, generator=GENERATOR)
    reference = bf16_reference(h, dequantize_int8(*quantize_int8_per_channel(table)), None)
    torch.testing.assert_close(head(h), reference, atol=0.05, rtol=0.02)


def test_shapes_the_int4_kernel_cannot_take_are_refused_naming_the_knob() -> None:
    with pytest.raises(ConfigError, match="quantization_group_size"):
        ReplicatedLinear(96, 48, False, torch.float32, quant_method=Int4LinearMethod(64))
    with pytest.raises(ConfigError, match="output size by 16"):
        ReplicatedLinear(64, 40, False, torch.float32, quant_method=Int4LinearMethod(32))


@pytest.mark.parametrize(
    ("quantization", "device", "message"),
    [
        ("int4", "cuda", "runs on the CPU only"),
    ],
)
def test_methods_refuse_devices_they_cannot_run_on(quantization: str, device: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        get_linear_method(quantization, torch.device(device), torch.float32)


def test_int8_off_the_cpu_uses_torch_ops() -> None:
    assert not Int8LinearMethod.for_device(torch.device("cuda"), torch.bfloat16, 32).use_cpu_kernel
    assert Int8LinearMethod.for_device(CPU, torch.float32, 32).use_cpu_kernel


def test_grouped_int8_is_two_int4_halves_summing_exactly_to_the_int8_weight() -> None:
    q, scale = quantize_int8_groupwise(WEIGHT, 32)
    high, low = split_int8_into_int4_pair(q, scale)
    assert all(0 <= int(part[0].min()) and int(part[0].max()) <= 15 for part in (high, low))
    exact = dequantize_int8_groupwise(q, scale.to(torch.bfloat16))
    assert torch.equal(dequantize_int4(*high) + dequantize_int4(*low), exact)
    layer = loaded_layer(Int8GroupedLinearMethod(32))
    torch.testing.assert_close(layer(X), bf16_reference(X, exact, BIAS), atol=0.05, rtol=0.01)
