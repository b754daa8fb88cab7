"""The throughput measurement's pieces: vLLM's acceptance figures, the model FLOPs formula."""

from __future__ import annotations

from engine.benchmarks.throughput_run import acceptance, model_flops
from engine.model_files import TINY_RANDOM_CONFIG
from engine.models import ArchConfig
from engine.outputs import SpecDecodingStats


def test_acceptance_figures_follow_vllms_definitions() -> None:
    before = SpecDecodingStats(3)
    before.observe(3, 1)
    after = SpecDecodingStats(3, before.num_drafts, before.num_draft_tokens, before.num_accepted_tokens,
                              list(before.num_accepted_tokens_per_pos))  # fmt: skip
    after.observe(3, 3)
    after.observe(2, 1)
    after.observe(3, 0)
    rate, length, per_pos = acceptance(before, after)
    assert rate == 4 / 8 and length == 1 + 4 / 3
    assert per_pos == [2 / 3, 1 / 3, 1 / 3]
    assert acceptance(before, None) == (None, None, [])


def test_model_flops_formula() -> None:
    arch = ArchConfig.from_hf(TINY_RANDOM_CONFIG)
    # per layer: qkv 64*(64+2*32) + o 64*64 + mlp 3*64*128 = 8192 + 4096 + 24576
    per_token = 2 * 2 * (8192 + 4096 + 24576)
    assert model_flops(arch, total_tokens=10, output_tokens=3) == per_token * 10 + 2 * 49152 * 64 * 3
