"""Prefix structure: shared-system-prompt groups with Zipf popularity, and Mooncake hash-id block rescaling.

Synthesis turns the structure into tokens: requests of one group share the group's first `prefix_len` tokens;
requests with equal hash ids share identical token blocks (see workloads.synthesis).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from workloads.spec import RequestSpec
from workloads.synthetic import random_lengths


def group_weights(num_groups: int, zipf_alpha: float = 0.0) -> np.ndarray:
    """Popularity of group k (0-based) proportional to 1/(k+1)^alpha; alpha 0 is uniform."""
    if num_groups < 1:
        raise ValueError(f"num_groups must be >= 1, got {num_groups}")
    if zipf_alpha < 0:
        raise ValueError(f"zipf_alpha must be >= 0, got {zipf_alpha}")
    weights = 1.0 / np.arange(1, num_groups + 1, dtype=np.float64) ** zipf_alpha
    return weights / weights.sum()


def assign_prefix_groups(
    specs: list[RequestSpec], num_groups: int, prefix_len: int, zipf_alpha: float = 0.0, seed: int = 0
) -> list[RequestSpec]:
    """Give each request a shared-system-prompt group; its prefix is min(prefix_len, input_len - 1) tokens of the
    group's prompt, so lengths never change and every request keeps at least one token of its own."""
    if prefix_len < 1:
        raise ValueError(f"prefix_len must be >= 1, got {prefix_len}")
    rng = np.random.default_rng(seed)
    groups = rng.choice(num_groups, size=len(specs), p=group_weights(num_groups, zipf_alpha))
    return [
        dataclasses.replace(spec, prefix_group=int(group), prefix_len=min(prefix_len, spec.input_len - 1) or None)
        for spec, group in zip(specs, groups, strict=True)
    ]


def shared_prefix(
    num_requests: int,
    num_groups: int = 64,
    prefix_len: int = 2048,
    suffix_len: int = 128,
    output_len: int = 256,
    range_ratio: float = 0.0,
    zipf_alpha: float = 0.0,
    seed: int = 0,
) -> list[RequestSpec]:
    """SGLang's generated-shared-prefix shape: num_groups system prompts of prefix_len tokens, each request one of
    them (uniform or Zipf-popular) plus a unique question of ~suffix_len tokens (vLLM-style range_ratio)."""
    suffixes = random_lengths(num_requests, suffix_len, output_len, range_ratio, seed)
    specs = [dataclasses.replace(spec, input_len=prefix_len + spec.input_len) for spec in suffixes]
    return assign_prefix_groups(specs, num_groups, prefix_len, zipf_alpha, seed + 1)


def rescale_hash_blocks(specs: list[RequestSpec], target_block_size: int) -> list[RequestSpec]:
    """Replay hash ids at the target's block size: each source block (e.g. Mooncake's 512 tokens) becomes
    target_block_size tokens, so input lengths shrink by target/source while the reuse structure (which requests
    share which blocks) is kept exactly. Useful for fitting Mooncake to a small model's context."""
    if target_block_size < 1:
        raise ValueError(f"target_block_size must be >= 1, got {target_block_size}")
    result = []
    for spec in specs:
        if spec.prefix_ids is None or not spec.prefix_block_size:
            raise ValueError("rescale_hash_blocks needs specs with prefix_ids and prefix_block_size (a Mooncake trace)")
        scaled = max(1, math.ceil(spec.input_len * target_block_size / spec.prefix_block_size))
        result.append(dataclasses.replace(spec, input_len=scaled, prefix_block_size=target_block_size))
    return result
