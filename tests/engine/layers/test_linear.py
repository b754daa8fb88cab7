"""Linear layers: world-size-1 identity with F.linear, fused loading, and the tensor-parallel sharding math
(ranks simulated in one process by passing tp_size/tp_rank)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from engine.layers.quantization import UnquantizedLinearMethod

torch.manual_seed(0)
X = torch.randn(5, 8)


@pytest.mark.parametrize("layer_cls", [ReplicatedLinear, ColumnParallelLinear, RowParallelLinear])
def test_world_size_1_layers_are_exactly_f_linear(layer_cls: type[ReplicatedLinear]) -> None:
    weight, bias = torch.randn(6, 8), torch.randn(6)
    layer = layer_cls(8, 6, True, torch.float32)
    assert (layer.tp_size, layer.tp_rank) == (1, 0)
    layer.weight_loader(layer.weight, weight)
    layer.weight_loader(layer.bias, bias)
    assert torch.equal(layer(X), F.linear(X, weight, bias))


def test_column_parallel_shards_concatenate_to_the_full_output() -> None:
    weight, bias = torch.randn(6, 8), torch.randn(6)
    outputs = []
    for rank in range(2):
        layer = ColumnParallelLinear(8, 6, True, torch.float32, tp_size=2, tp_rank=rank)
        layer.weight_loader(layer.weight, weight)
        layer.weight_loader(layer.bias, bias)
        outputs.append(layer(X))
    torch.testing.assert_close(torch.cat(outputs, dim=-1), F.linear(X, weight, bias))


def test_row_parallel_partial_sums_add_up_to_the_full_output() -> None:
    weight = torch.randn(4, 8)
    partial = torch.zeros(5, 4)
    for rank in range(2):
        layer = RowParallelLinear(8, 4, False, torch.float32, tp_size=2, tp_rank=rank)
        layer.weight_loader(layer.weight, weight)
        partial += layer.quant_method.apply(layer, X[:, rank * 4 : (rank + 1) * 4], None)
    torch.testing.assert_close(partial, F.linear(X, weight))


def test_merged_and_qkv_projections_equal_separate_ones() -> None:
    gate, up = torch.randn(3, 8), torch.randn(3, 8)
    merged = MergedColumnParallelLinear(8, [3, 3], False, torch.float32)
    merged.weight_loader(merged.weight, gate, 0)
    merged.weight_loader(merged.weight, up, 1)
    torch.testing.assert_close(merged(X), torch.cat([F.linear(X, gate), F.linear(X, up)], dim=-1))
    with pytest.raises(ValueError, match="one shard index in"):
        merged.weight_loader(merged.weight, up, 2)

    q, k, v = torch.randn(4 * 2, 8), torch.randn(2 * 2, 8), torch.randn(2 * 2, 8)
    qkv = QKVParallelLinear(8, 2, 4, 2, False, torch.float32)
    for shard, tensor in (("q", q), ("k", k), ("v", v)):
        qkv.weight_loader(qkv.weight, tensor, shard)
    torch.testing.assert_close(qkv(X), F.linear(X, torch.cat([q, k, v])))
    assert isinstance(qkv.quant_method, UnquantizedLinearMethod)
    assert (qkv.num_heads, qkv.num_kv_heads) == (4, 2)


def test_qkv_with_more_ranks_than_kv_heads_replicates_kv() -> None:
    q, k, v = torch.randn(4 * 2, 8), torch.randn(1 * 2, 8), torch.randn(1 * 2, 8)
    for rank in range(2):
        layer = QKVParallelLinear(8, 2, 4, 1, False, torch.float32, tp_size=2, tp_rank=rank)
        assert (layer.num_heads, layer.num_kv_heads, layer.num_kv_head_replicas) == (2, 1, 2)
        for shard, tensor in (("q", q), ("k", k), ("v", v)):
            layer.weight_loader(layer.weight, tensor, shard)
        expected = torch.cat([q[rank * 4 : (rank + 1) * 4], k, v])
        torch.testing.assert_close(layer.weight.data, expected)


def test_uneven_shards_and_bad_ranks_are_refused() -> None:
    with pytest.raises(ValueError, match="6 is not divisible by the tensor-parallel size 4"):
        ColumnParallelLinear(8, 6, False, torch.float32, tp_size=4, tp_rank=0)
    with pytest.raises(ValueError, match="tp_rank must be in"):
        RowParallelLinear(8, 4, False, torch.float32, tp_size=2, tp_rank=2)


def test_checkpoint_tensor_of_the_wrong_shape_is_refused() -> None:
    layer = ReplicatedLinear(8, 6, False, torch.float32)
    with pytest.raises(ValueError, match=r"shape \(6, 7\), the layer expects \(6, 8\)"):
        layer.weight_loader(layer.weight, torch.randn(6, 7))
