"""Two tensor-parallel ranks (gloo on loopback, CPU) against the unsharded computation.

The column/row-parallel linears, the vocab-parallel embedding and the LM head, and whole Llama/Qwen2 models
(with tied and untied LM heads): the ranks' all-reduced / all-gathered results equal a single process's.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

from engine.attention import get_attention_backend
from engine.distributed import (
    destroy_model_parallel,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    init_distributed_environment,
    initialize_model_parallel,
    tensor_model_parallel_all_gather,
)
from engine.layers.linear import ColumnParallelLinear, RowParallelLinear
from engine.layers.logits_processor import LogitsProcessor
from engine.layers.quantization import get_linear_method
from engine.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from engine.model_files import TINY_RANDOM_CONFIG, materialize_random_model, materialize_tiny_random
from engine.model_loader import load_model, process_weights_after_loading

WORLD_SIZE = 2
PROMPT = torch.randint(0, 512, (20,), generator=torch.Generator().manual_seed(1))


def model_logits(path: Path) -> torch.Tensor:
    """All-position logits of PROMPT through the model built for this process's rank (fresh prefill)."""
    model, arch, _ = load_model(str(path), torch.float32, torch.device("cpu"))
    tp_size = get_tensor_model_parallel_world_size()
    num_heads, num_kv_heads = arch.get_num_attention_heads(tp_size), arch.get_num_kv_heads(tp_size)
    backend = get_attention_backend("torch")(num_heads, num_kv_heads, arch.head_dim, arch.head_dim**-0.5, 16)
    n = len(PROMPT)
    metadata = backend.build_metadata([n], [n], [[0] * -(-n // 16)], torch.full((n,), -1), torch.device("cpu"))
    with torch.inference_mode():
        return model.compute_logits(model(PROMPT, torch.arange(n), backend, metadata))


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """torch.allclose with the largest difference as the message (torch.testing's first call costs ~1.5 s)."""
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.allclose(actual, expected, atol=1e-5, rtol=1e-5), (actual - expected).abs().max()


def check_layers() -> None:
    rank = get_tensor_model_parallel_rank()
    generator = torch.Generator().manual_seed(0)  # the same tensors on every rank
    x, weight, bias = (torch.randn(*shape, generator=generator) for shape in ((5, 8), (6, 8), (6,)))
    column = ColumnParallelLinear(8, 6, True, torch.float32, quant_method=get_linear_method("none", x.device, x.dtype))
    assert column.weight.shape == (3, 8)
    column.weight_loader(column.weight, weight)
    column.weight_loader(column.bias, bias)
    process_weights_after_loading(column)
    assert_close(tensor_model_parallel_all_gather(column(x)), F.linear(x, weight, bias))

    row = RowParallelLinear(6, 8, True, torch.float32)
    row.weight_loader(row.weight, weight.T.contiguous())
    row.weight_loader(row.bias, torch.ones(8))
    x_shard = torch.randn(5, 6, generator=generator)
    assert_close(row(x_shard[:, rank * 3 : (rank + 1) * 3]), F.linear(x_shard, weight.T) + 1)

    table, ids = torch.randn(11, 4, generator=generator), torch.tensor([0, 5, 6, 10, 6])
    embedding = VocabParallelEmbedding(11, 4, torch.float32)
    embedding.weight_loader(embedding.weight, table)
    assert_close(embedding(ids), F.embedding(ids, table))
    lm_head = ParallelLMHead(11, 4, torch.float32)
    lm_head.tie_weights(embedding)
    hidden = torch.randn(3, 4, generator=generator)
    assert_close(LogitsProcessor(11)(lm_head, hidden), F.linear(hidden, table))


def worker(rank: int, init_method: str, model_paths: list[Path], out_dir: Path) -> None:
    torch.set_num_threads(1)
    init_distributed_environment(WORLD_SIZE, rank, init_method, backend="gloo")
    initialize_model_parallel(WORLD_SIZE)
    try:
        check_layers()
        for i, path in enumerate(model_paths):
            logits = model_logits(path)
            if rank == 0:
                torch.save(logits, out_dir / f"logits{i}.pt")
    finally:
        destroy_model_parallel()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # two spawned processes each import torch: ~10 s on 2 cores
def test_two_ranks_equal_one_process(tmp_path: Path) -> None:
    tied_qwen2 = dict(
        TINY_RANDOM_CONFIG,
        vocab_size=512,
        architectures=["Qwen2ForCausalLM"],
        model_type="qwen2",
        tie_word_embeddings=True,
        use_sliding_window=False,
    )
    model_paths = [
        materialize_tiny_random(),
        materialize_random_model(tmp_path / "qwen2", tied_qwen2, seed=3, tokenizer_name=None),
    ]
    init_method = f"tcp://127.0.0.1:{free_port()}"
    mp.spawn(worker, args=(init_method, model_paths, tmp_path), nprocs=WORLD_SIZE, join=True)
    assert get_tensor_model_parallel_world_size() == 1  # the parent process never joined the group
    for i, path in enumerate(model_paths):
        expected = model_logits(path)
        torch.testing.assert_close(torch.load(tmp_path / f"logits{i}.pt"), expected, atol=1e-4, rtol=1e-4)
