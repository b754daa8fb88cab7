"""The token embedding and the LM head, each sharded by vocabulary rows over the tensor-parallel ranks.

Rank r holds rows [r * per_rank, min((r + 1) * per_rank, vocab_size)) with per_rank = ceil(vocab_size /
tp_size); the last rank's rows past the vocabulary are zero. With a tensor-parallel size of 1 the embedding
is F.embedding over the whole table and the LM head an ordinary linear layer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.distributed import tensor_model_parallel_all_reduce
from engine.layers.linear import copy_checked, resolve_tp
from engine.layers.quantization import Int8EmbeddingMethod, LinearMethodBase, UnquantizedLinearMethod


class VocabParallelEmbedding(nn.Module):
    """Token id -> embedding row; each rank looks up the ids in its rows and the ranks' results are summed."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        dtype: torch.dtype,
        tp_size: int | None = None,
        tp_rank: int | None = None,
    ) -> None:
        super().__init__()
        self.tp_size, self.tp_rank = resolve_tp(tp_size, tp_rank)
        self.org_vocab_size, self.embedding_dim = num_embeddings, embedding_dim
        self.num_embeddings_per_partition = -(-num_embeddings // self.tp_size)
        self.vocab_start_index = min(self.tp_rank * self.num_embeddings_per_partition, num_embeddings)
        self.vocab_end_index = min(self.vocab_start_index + self.num_embeddings_per_partition, num_embeddings)
        # Set by the model loader when the table is quantized (engine.layers.quantization.Int8EmbeddingMethod).
        self.embedding_method: Int8EmbeddingMethod | None = None
        self.create_weights(dtype)

    def create_weights(self, dtype: torch.dtype) -> None:
        weight = nn.Parameter(torch.empty(self.num_embeddings_per_partition, self.embedding_dim, dtype=dtype), False)
        weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]
        self.register_parameter("weight", weight)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        if loaded.shape[0] != self.org_vocab_size:
            raise ValueError(
                f"checkpoint tensor has {loaded.shape[0]} vocabulary rows, the layer {self.org_vocab_size}"
            )
        rows = self.vocab_end_index - self.vocab_start_index
        copy_checked(param.data[:rows], loaded[self.vocab_start_index : self.vocab_end_index])
        param.data[rows:].zero_()

    def lookup(self, local_ids: torch.Tensor) -> torch.Tensor:
        """This rank's rows for `local_ids`, in the model's dtype."""
        if self.embedding_method is not None:
            return self.embedding_method.embedding(self, local_ids)
        return F.embedding(local_ids, self.weight)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self.lookup(input_ids)
        in_shard = (input_ids >= self.vocab_start_index) & (input_ids < self.vocab_end_index)
        local_ids = (input_ids - self.vocab_start_index) * in_shard
        embedded = self.lookup(local_ids)
        return tensor_model_parallel_all_reduce(embedded * in_shard.unsqueeze(-1).to(embedded.dtype))


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection hidden -> vocabulary logits: a linear layer whose rows are vocabulary-parallel.

    Its `quant_method` creates the [vocab rows, hidden] weight and runs the matmul, as for every other linear
    layer; `LogitsProcessor` gathers the ranks' logits. `tie_weights` shares the embedding's weight.
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        dtype: torch.dtype,
        tp_size: int | None = None,
        tp_rank: int | None = None,
        quant_method: LinearMethodBase | None = None,
    ) -> None:
        self.quant_method = quant_method or UnquantizedLinearMethod()
        super().__init__(num_embeddings, embedding_dim, dtype, tp_size, tp_rank)

    def create_weights(self, dtype: torch.dtype) -> None:
        self.quant_method.create_weights(self, self.embedding_dim, self.num_embeddings_per_partition, dtype)

    def tie_weights(self, embed_tokens: VocabParallelEmbedding) -> None:
        """Use the embedding's weight (same vocabulary shard) as this head's weight."""
        if (embed_tokens.vocab_start_index, embed_tokens.vocab_end_index) != (
            self.vocab_start_index,
            self.vocab_end_index,
        ):
            raise ValueError("a tied LM head must shard the vocabulary like its embedding")
        self.weight = embed_tokens.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """This rank's logits, [num_tokens, num_embeddings_per_partition]."""
        return self.quant_method.apply(self, hidden, None)
