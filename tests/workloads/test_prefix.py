import numpy as np
import pytest

import workloads
from workloads import prefix
from workloads.spec import RequestSpec


def test_zipf_weights():
    assert prefix.group_weights(4, 0.0).tolist() == [0.25] * 4
    weights = prefix.group_weights(3, 1.0)
    assert weights == pytest.approx(np.array([1, 1 / 2, 1 / 3]) / (11 / 6))


def test_assigned_groups_follow_popularity_and_keep_lengths():
    specs = [RequestSpec(50 if i % 2 else 500, 1) for i in range(20000)]
    grouped = prefix.assign_prefix_groups(specs, num_groups=4, prefix_len=100, zipf_alpha=1.2, seed=0)
    counts = np.bincount([s.prefix_group for s in grouped], minlength=4) / len(grouped)
    assert counts == pytest.approx(prefix.group_weights(4, 1.2), abs=0.01)
    assert [s.input_len for s in grouped] == [s.input_len for s in specs]
    assert {s.prefix_len for s in grouped} == {49, 100}


def test_shared_prefix_generator():
    specs = workloads.load("shared-prefix", num_requests=100, num_groups=8, prefix_len=256, input_len=32, seed=0)
    assert {s.input_len for s in specs} == {288} and {s.prefix_len for s in specs} == {256}
    assert {s.prefix_group for s in specs} <= set(range(8)) and len({s.prefix_group for s in specs}) == 8


def test_rescale_hash_blocks():
    specs = [RequestSpec(1100, 5, prefix_ids=[0, 1, 2], prefix_block_size=512)]
    (scaled,) = prefix.rescale_hash_blocks(specs, 16)
    assert scaled.input_len == 35 and scaled.prefix_ids == [0, 1, 2] and scaled.prefix_block_size == 16
    with pytest.raises(ValueError, match="needs specs with prefix_ids"):
        prefix.rescale_hash_blocks([RequestSpec(10, 1)], 16)
