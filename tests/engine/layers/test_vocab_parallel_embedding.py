"""Vocab-parallel embedding and LM head: world-size-1 identity with F.embedding / F.linear, and the vocabulary
sharding math (ranks simulated in one process by passing tp_size/tp_rank)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.layers.logits_processor import LogitsProcessor
from engine.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

VOCAB, HIDDEN = 11, 4
torch.manual_seed(0)
TABLE = torch.randn(VOCAB, HIDDEN)
IDS = torch.tensor([0, 5, 6, 10, 3, 6])
HIDDEN_STATES = torch.randn(3, HIDDEN)


def test_world_size_1_embedding_is_f_embedding() -> None:
    embedding = VocabParallelEmbedding(VOCAB, HIDDEN, torch.float32)
    embedding.weight_loader(embedding.weight, TABLE)
    assert torch.equal(embedding(IDS), F.embedding(IDS, TABLE))


def test_world_size_1_lm_head_is_f_linear() -> None:
    lm_head = ParallelLMHead(VOCAB, HIDDEN, torch.float32)
    lm_head.weight_loader(lm_head.weight, TABLE)
    assert torch.equal(LogitsProcessor(VOCAB)(lm_head, HIDDEN_STATES), F.linear(HIDDEN_STATES, TABLE))


def test_embedding_shards_sum_to_the_full_lookup() -> None:
    """Each rank embeds only the ids in its rows (zeros elsewhere); the all-reduce adds the ranks up."""
    total = torch.zeros(len(IDS), HIDDEN)
    for rank in range(2):
        shard = VocabParallelEmbedding(VOCAB, HIDDEN, torch.float32, tp_size=2, tp_rank=rank)
        assert shard.weight.shape == (6, HIDDEN)
        shard.weight_loader(shard.weight, TABLE)
        total += shard(IDS)  # a world of size 1: the reduction is the identity, the partial result stays
    torch.testing.assert_close(total, F.embedding(IDS, TABLE))


def test_lm_head_shards_concatenate_to_the_full_logits_and_pad_with_zero_rows() -> None:
    shards = []
    for rank in range(2):
        lm_head = ParallelLMHead(VOCAB, HIDDEN, torch.float32, tp_size=2, tp_rank=rank)
        lm_head.weight_loader(lm_head.weight, TABLE)
        shards.append(lm_head(HIDDEN_STATES))
    assert torch.equal(lm_head.weight[-1], torch.zeros(HIDDEN))  # rank 1 holds rows 6..10 and one padding row
    logits = torch.cat(shards, dim=-1)
    assert logits.shape == (3, 12)
    torch.testing.assert_close(logits[:, :VOCAB], F.linear(HIDDEN_STATES, TABLE))


def test_tied_lm_head_shares_the_embedding_weight() -> None:
    embedding = VocabParallelEmbedding(VOCAB, HIDDEN, torch.float32)
    lm_head = ParallelLMHead(VOCAB, HIDDEN, torch.float32)
    lm_head.tie_weights(embedding)
    embedding.weight_loader(embedding.weight, TABLE)
    assert lm_head.weight is embedding.weight
    assert torch.equal(lm_head(HIDDEN_STATES), F.linear(HIDDEN_STATES, TABLE))


def test_tying_to_an_embedding_of_another_shard_is_refused() -> None:
    embedding = VocabParallelEmbedding(VOCAB, HIDDEN, torch.float32, tp_size=2, tp_rank=0)
    lm_head = ParallelLMHead(VOCAB, HIDDEN, torch.float32, tp_size=2, tp_rank=1)
    with pytest.raises(ValueError, match="shard the vocabulary like its embedding"):
        lm_head.tie_weights(embedding)


def test_checkpoint_with_another_vocabulary_is_refused() -> None:
    embedding = VocabParallelEmbedding(VOCAB, HIDDEN, torch.float32)
    with pytest.raises(ValueError, match="12 vocabulary rows, the layer 11"):
        embedding.weight_loader(embedding.weight, torch.randn(12, HIDDEN))
