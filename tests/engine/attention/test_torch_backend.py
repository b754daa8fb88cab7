"""Paged torch attention against a dense causal float64 reference."""

from __future__ import annotations

import pytest
import torch

from engine.attention import TorchAttentionBackend
from engine.attention.torch_backend import DecodeMirror


def dense_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context: int, scale: float) -> torch.Tensor:
    """q: [n, H, D] for positions context..context+n-1; k/v: [context+n, KVH, D] -> [n, H, D]."""
    group = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    allowed = torch.arange(k.shape[0])[None, :] <= (torch.arange(q.shape[0]) + context)[:, None]
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).float()


def random_sequence(total: int, heads: int, kv_heads: int, dim: int, blocks: list[int]) -> dict:
    """Random q/k/v for positions 0..total-1 of one sequence, whose KV lives in `blocks`."""
    q, k, v = torch.randn(total, heads, dim), torch.randn(total, kv_heads, dim), torch.randn(total, kv_heads, dim)
    return {"q": q, "k": k, "v": v, "blocks": blocks}


def run_step(
    backend: TorchAttentionBackend,
    cache: torch.Tensor,
    seqs: list[dict],
    starts: list[int],
    ends: list[int],
) -> torch.Tensor:
    """Run tokens [start, end) of every sequence as one flat batch; returns the attention output."""
    bs = backend.block_size
    q, k, v, slots, query_lens, seq_lens, tables = [], [], [], [], [], [], []
    for seq, start, end in zip(seqs, starts, ends, strict=True):
        q.append(seq["q"][start:end])
        k.append(seq["k"][start:end])
        v.append(seq["v"][start:end])
        slots += [seq["blocks"][p // bs] * bs + p % bs for p in range(start, end)]
        query_lens.append(end - start)
        seq_lens.append(end)
        tables.append(seq["blocks"])
    metadata = backend.build_metadata(query_lens, seq_lens, tables, torch.tensor(slots), torch.device("cpu"))
    return backend.forward(torch.cat(q), torch.cat(k), torch.cat(v), cache, metadata)


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(8, 2), (4, 4)])
def test_mixed_prefill_and_decode_batch_matches_dense(block_size: int, num_heads: int, num_kv_heads: int) -> None:
    torch.manual_seed(block_size * 100 + num_kv_heads)
    head_dim, scale, num_blocks = 16, 0.25, 256
    backend = TorchAttentionBackend(num_heads, num_kv_heads, head_dim, scale, block_size)
    cache = torch.randn(backend.kv_cache_shape(num_blocks))  # stale values must never leak in
    free = torch.randperm(num_blocks).tolist()
    # (context already cached, tokens this step): decodes, chunked prefills with context, fresh prefills.
    shapes = [(9, 1), (0, 1), (33, 1), (5, 12), (16, 7), (0, 20), (0, 3), (40, 1)]
    seqs = []
    for context, new in shapes:
        total = context + new
        blocks = [free.pop() for _ in range(-(-total // block_size))]
        seqs.append(random_sequence(total, num_heads, num_kv_heads, head_dim, blocks))
    # zero the blocks first: the model runner's invariant (slots read are finite and written or zero)
    for seq in seqs:
        cache[:, :, seq["blocks"]] = 0
    warm = [(i, c) for i, (c, _) in enumerate(shapes) if c > 0]
    run_step(backend, cache, [seqs[i] for i, _ in warm], [0] * len(warm), [c for _, c in warm])
    out = run_step(backend, cache, seqs, [c for c, _ in shapes], [c + n for c, n in shapes])
    offset = 0
    for seq, (context, new) in zip(seqs, shapes, strict=True):
        total = context + new
        expected = dense_reference(seq["q"][context:total], seq["k"][:total], seq["v"][:total], context, scale)
        torch.testing.assert_close(out[offset : offset + new], expected, atol=1e-5, rtol=1e-5)
        offset += new


def test_decodes_after_prefills_in_the_batch_order() -> None:
    """Decode tokens that are not the first tokens of the batch take the indexed path."""
    torch.manual_seed(0)
    backend = TorchAttentionBackend(4, 2, 8, 0.3, 4)
    cache = torch.zeros(backend.kv_cache_shape(32))
    seqs = [
        {"q": torch.randn(6, 4, 8), "k": torch.randn(6, 2, 8), "v": torch.randn(6, 2, 8), "blocks": [3, 9]},
        {"q": torch.randn(4, 4, 8), "k": torch.randn(4, 2, 8), "v": torch.randn(4, 2, 8), "blocks": [7]},
    ]
    run_step(backend, cache, seqs[1:], [0], [3])
    out = run_step(backend, cache, seqs, [0, 3], [6, 4])
    torch.testing.assert_close(out[:6], dense_reference(seqs[0]["q"], seqs[0]["k"], seqs[0]["v"], 0, 0.3))
    expected = dense_reference(seqs[1]["q"][3:], seqs[1]["k"], seqs[1]["v"], 3, 0.3)
    torch.testing.assert_close(out[6:], expected, atol=1e-5, rtol=1e-5)


def test_kv_is_written_to_its_slots_and_negative_slots_are_skipped() -> None:
    backend = TorchAttentionBackend(2, 1, 4, 1.0, 2)
    cache = torch.zeros(backend.kv_cache_shape(4))
    k, v = torch.arange(12.0).view(3, 1, 4), -torch.arange(12.0).view(3, 1, 4)
    metadata = backend.build_metadata([3], [3], [[2, 0]], torch.tensor([5, -1, 0]), torch.device("cpu"))
    backend.forward(torch.zeros(3, 2, 4), k, v, cache, metadata)
    flat = cache.view(2, 1, 8, 4)
    torch.testing.assert_close(flat[0, 0, 5], k[0, 0])
    torch.testing.assert_close(flat[1, 0, 0], v[2, 0])
    assert flat[:, :, [1, 2, 3, 4, 6, 7]].abs().sum() == 0


def test_block_table_too_short_is_rejected() -> None:
    backend = TorchAttentionBackend(2, 1, 4, 1.0, 4)
    with pytest.raises(ValueError, match="needs 2 blocks"):
        backend.build_metadata([1], [5], [[0]], torch.tensor([4]), torch.device("cpu"))


@pytest.mark.parametrize("mirror_budget", [0, 32 * 2**20])
def test_many_decode_steps_through_the_mirror(mirror_budget: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Steady decoding (mirror appends), block-boundary crossings, outgrowing the headroom, a sequence
    leaving the batch: every step must equal the dense reference. Budget 0 forces the gather-only path."""
    monkeypatch.setattr("engine.attention.torch_backend.MIRROR_BYTES_PER_LAYER", mirror_budget)
    torch.manual_seed(3)
    block_size, heads, kv_heads, dim, scale = 2, 4, 2, 8, 0.35
    backend = TorchAttentionBackend(heads, kv_heads, dim, scale, block_size)
    cache = torch.zeros(backend.kv_cache_shape(128))
    free = torch.randperm(128).tolist()
    prompts, steps = [3, 6, 1], 14
    seqs = []
    for n in prompts:
        total = n + steps
        seqs.append(random_sequence(total, heads, kv_heads, dim, [free.pop() for _ in range(-(-total // block_size))]))
    run_step(backend, cache, seqs, [0] * 3, prompts)
    plans: list[DecodeMirror] = []
    plan = backend._plan_decode_mirror

    def spy(tables: list[list[int]], lens: list[int]) -> DecodeMirror:
        plans.append(plan(tables, lens))
        return plans[-1]

    monkeypatch.setattr(backend, "_plan_decode_mirror", spy)
    for step in range(steps):
        live = [i for i in range(3) if not (i == 1 and step >= 12)]  # sequence 1 stops after 12 decode steps
        starts = [prompts[i] + step for i in live]
        for i, start in zip(live, starts, strict=True):  # a table only holds the blocks written so far
            seqs[i]["table"] = seqs[i]["blocks"][: -(-(start + 1) // block_size)]
        view = [dict(seqs[i], blocks=seqs[i]["table"]) for i in live]
        out = run_step(backend, cache, view, starts, [s + 1 for s in starts])
        for row, (i, start) in enumerate(zip(live, starts, strict=True)):
            seq = seqs[i]
            q, k, v = seq["q"][start : start + 1], seq["k"][: start + 1], seq["v"][: start + 1]
            expected = dense_reference(q, k, v, start, scale)
            torch.testing.assert_close(out[row : row + 1], expected, atol=1e-5, rtol=1e-5)
    if mirror_budget:  # first step, headroom outgrown (step 10), sequence 1 leaving (step 12): rebuilds
        assert plans.count(DecodeMirror.REBUILD) >= 3 and plans.count(DecodeMirror.APPEND) >= 8
    else:
        assert set(plans) == {DecodeMirror.OFF}


def test_a_verification_step_with_rejected_drafts_between_decode_steps() -> None:
    """Sequence 0 decodes, then verifies 3 drafts in one step (4 query tokens with cached context) while the
    others decode; 1 draft is accepted, so the next steps overwrite the 2 rejected drafts' slots. Every step
    must equal the dense reference over the accepted tokens only: the mirror never serves a rejected draft."""
    torch.manual_seed(11)
    block_size, heads, kv_heads, dim, scale = 4, 4, 2, 8, 0.35
    backend = TorchAttentionBackend(heads, kv_heads, dim, scale, block_size)
    cache = torch.zeros(backend.kv_cache_shape(64))
    free = torch.randperm(64).tolist()
    prompts, total = [5, 7, 2], 24
    num_blocks = total // block_size
    seqs = [random_sequence(total, heads, kv_heads, dim, [free.pop() for _ in range(num_blocks)]) for _ in prompts]
    run_step(backend, cache, seqs, [0] * 3, prompts)
    lens = list(prompts)

    def check(out: torch.Tensor, starts: list[int], ends: list[int], truth: list[dict]) -> None:
        row = 0
        for seq, start, end in zip(truth, starts, ends, strict=True):
            expected = dense_reference(seq["q"][start:end], seq["k"][:end], seq["v"][:end], start, scale)
            torch.testing.assert_close(out[row : row + end - start], expected, atol=1e-5, rtol=1e-5)
            row += end - start

    for _ in range(3):  # steady decoding: the mirror appends
        out = run_step(backend, cache, seqs, lens, [n + 1 for n in lens])
        check(out, lens, [n + 1 for n in lens], seqs)
        lens = [n + 1 for n in lens]
    # Verification step for sequence 0: its next token and 3 drafts whose last 2 will be rejected.
    drafted = dict(seqs[0], k=seqs[0]["k"].clone(), v=seqs[0]["v"].clone())
    drafted["k"][lens[0] + 2 : lens[0] + 4] = torch.randn(2, kv_heads, dim) * 5
    drafted["v"][lens[0] + 2 : lens[0] + 4] = torch.randn(2, kv_heads, dim) * 5
    ends = [lens[0] + 4, lens[1] + 1, lens[2] + 1]
    out = run_step(backend, cache, [drafted, *seqs[1:]], lens, ends)
    check(out, lens, ends, [drafted, *seqs[1:]])
    lens = [lens[0] + 2, lens[1] + 1, lens[2] + 1]  # the known token + 1 accepted draft
    for _ in range(4):  # decoding again: the true KV overwrites the rejected drafts' slots
        out = run_step(backend, cache, seqs, lens, [n + 1 for n in lens])
        check(out, lens, [n + 1 for n in lens], seqs)
        lens = [n + 1 for n in lens]
