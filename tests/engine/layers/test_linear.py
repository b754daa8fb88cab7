"""Linear layers: fused loading and the tensor-parallel sharding math (ranks simulated in one process)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    UnquantizedLinearMethod,
)

torch.manual_seed(0)
X = torch.randn(5, 8)


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

    q, k, v = torch.randn(4 * 2, 8), torch.randn(2 * 2, 8), torch.randn(2 * 2, 8)
    qkv = QKVParallelLinear(8, 2, 4, 2, False, torch.float32)
    for shard, tensor in (("q", q), ("k", k), ("v", v)):
        qkv.weight_loader(qkv.weight, tensor, shard)
    torch.testing.assert_close(qkv(X), F.linear(X, torch.cat([q, k, v])))
    assert isinstance(qkv.quant_method, UnquantizedLinearMethod)


def test_qkv_with_more_ranks_than_kv_heads_replicates_kv() -> None:
    q, k, v = torch.randn(4 * 2, 8), torch.randn(1 * 2, 8), torch.randn(1 * 2, 8)
    for rank in range(2):
        layer = QKVParallelLinear(8, 2, 4, 1, False, torch.float32, tp_size=2, tp_rank=rank)
        for shard, tensor in (("q", q), ("k", k), ("v", v)):
            layer.weight_loader(layer.weight, tensor, shard)
        expected = torch.cat([q[rank * 4 : (rank + 1) * 4], k, v])
        torch.testing.assert_close(layer.weight.data, expected)
