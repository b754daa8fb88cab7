"""Hidden states -> vocabulary logits through the LM head, gathered from the tensor-parallel ranks."""

from __future__ import annotations

import torch
from torch import nn

from engine.distributed import tensor_model_parallel_all_gather
from engine.layers.vocab_parallel_embedding import ParallelLMHead


class LogitsProcessor(nn.Module):
    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size

    def forward(self, lm_head: ParallelLMHead, hidden: torch.Tensor) -> torch.Tensor:
        """[num_tokens, vocab_size] logits; the zero rows padding the last rank's shard are dropped."""
        logits = tensor_model_parallel_all_gather(lm_head(hidden), dim=-1)
        return logits if logits.shape[-1] == self.vocab_size else logits[..., : self.vocab_size]
