"""Sampler: hand-computed masks and penalties, seeded reproducibility, distribution, logprobs."""

from __future__ import annotations

import math

import pytest
import torch

from engine.request import Request
from engine.sampler import (
    Sampler,
    SamplingMetadata,
    _top_k_top_p_candidates,
    apply_min_p,
    apply_penalties,
    apply_token_bitmask,
    apply_top_k_top_p,
    draw_uniforms,
    sample_categorical,
)
from engine.sampling_params import SamplingParams

CPU = torch.device("cpu")
NEG_INF = float("-inf")


def make_request(
    request_id: str, prompt: list[int] | None = None, output: list[int] | None = None, eos: int = 0, **params: object
) -> Request:
    request = Request(request_id, prompt or [1, 2, 3], SamplingParams(max_tokens=64, **params), eos, 64)
    request.output_token_ids = list(output or [])
    return request


def sample(requests: list[Request], logits: torch.Tensor, generators: dict | None = None, seed: int = 0) -> list[int]:
    metadata = SamplingMetadata.build(requests, logits.shape[1], CPU, {} if generators is None else generators)
    return Sampler(CPU, seed)(logits, metadata).sampled_token_ids


def test_top_k_keeps_the_k_largest_and_ties() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 3.0, 4.0], [4.0, 1.0, 2.0, 3.0]])
    out = apply_top_k_top_p(logits, torch.tensor([2, 2, 4]), None)
    expected = torch.tensor([[NEG_INF, NEG_INF, 3.0, 4.0], [NEG_INF, 3.0, 3.0, 4.0], [4.0, 1.0, 2.0, 3.0]])
    assert torch.equal(out, expected)


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    logits = torch.tensor([[0.1, 0.2, 0.3, 0.4]]).log().repeat(3, 1)
    out = apply_top_k_top_p(logits, None, torch.tensor([0.75, 0.5, 0.35]))
    kept = torch.isfinite(out)
    assert kept.tolist() == [[False, True, True, True], [False, False, True, True], [False, False, False, True]]
    assert torch.allclose(out[kept], logits[kept])


def test_top_k_then_top_p() -> None:
    logits = torch.tensor([[0.1, 0.2, 0.3, 0.4]]).log()
    # top-k=3 renormalises to (2, 3, 4)/9; top_p=0.5 then keeps 4/9 and 3/9.
    out = apply_top_k_top_p(logits, torch.tensor([3]), torch.tensor([0.5]))
    assert torch.isfinite(out).tolist() == [[False, False, True, True]]


def test_top_k_top_p_over_candidates_equals_the_full_sort() -> None:
    torch.manual_seed(0)
    vocab = 3000
    scale = torch.tensor([[0.5], [1.0], [6.0], [8.0], [3.0], [8.0]])  # rows 0-1 nearly flat, 2-5 peaked
    logits = torch.randn(6, vocab) * scale
    cases = [
        (torch.tensor([vocab, 20, 50, vocab, 5, vocab]), torch.tensor([1.0, 1.0, 0.5, 0.95, 0.7, 0.6])),
        (None, torch.tensor([1.0, 1.0, 0.8, 0.9, 1.0, 0.5])),
        (torch.tensor([1, 64, vocab, 7, vocab, 63]), None),
        (torch.tensor([10, 30, vocab, vocab, vocab, 2]), torch.tensor([0.9, 0.3, 1.0, 0.8, 1.0, 0.99])),
    ]
    for top_k, top_p in cases:
        assert _top_k_top_p_candidates(logits, top_k, top_p, 64) is not None  # the fast path really runs
        full = apply_top_k_top_p(logits, top_k, top_p, num_candidates=vocab)
        fast = apply_top_k_top_p(logits, top_k, top_p, num_candidates=64)
        assert torch.equal(torch.isfinite(fast), torch.isfinite(full))
        assert torch.equal(fast[torch.isfinite(fast)], logits[torch.isfinite(full)])
    # A flat row with top_p=0.9 (or top_k=100) needs more than 64 candidates: the exact sort takes over.
    flat_top_p = torch.tensor([0.9] + [1.0] * 5)
    assert _top_k_top_p_candidates(logits, None, flat_top_p, 64) is None
    assert _top_k_top_p_candidates(logits, torch.tensor([100] + [vocab] * 5), None, 64) is None
    assert torch.isfinite(apply_top_k_top_p(logits, None, flat_top_p, 64))[0].sum() > 64


def test_min_p_drops_tokens_below_a_fraction_of_the_top_one() -> None:
    logits = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.1, 0.2, 0.3, 0.4]]).log()
    out = apply_min_p(logits, torch.tensor([0.6, 0.0]))  # 0.6 × 0.4 = 0.24
    assert torch.isfinite(out).tolist() == [[False, False, True, True], [True] * 4]


def test_penalties_match_vllm_semantics() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, 1.0]])
    request = make_request("a", prompt=[0], output=[1, 2, 2], repetition_penalty=2.0, frequency_penalty=0.5,
                           presence_penalty=0.25)
    metadata = SamplingMetadata.build([request], 4, CPU, {})
    # token 0: prompt only → 2/2; token 1: once in output → -1*2 - 0.5 - 0.25;
    # token 2: twice → 0.5/2 - 2*0.5 - 0.25; token 3: untouched.
    assert apply_penalties(logits, metadata).tolist() == [[1.0, -2.75, -1.0, 1.0]]


def test_penalties_change_greedy_choice_only_for_the_penalised_row() -> None:
    logits = torch.tensor([[0.0, 1.0, 0.9], [0.0, 1.0, 0.9]])
    requests = [
        make_request("a", output=[1], temperature=0.0, presence_penalty=0.5),
        make_request("b", temperature=0.0),
    ]
    assert sample(requests, logits) == [2, 1]


def test_min_tokens_masks_eos_and_stop_ids_until_reached() -> None:
    logits = torch.tensor([[5.0, 4.0, 3.0, 0.0]] * 3)
    requests = [
        make_request("short", output=[3], eos=0, min_tokens=2, stop_token_ids=[1], temperature=0.0),
        make_request("done", output=[3, 3], eos=0, min_tokens=2, stop_token_ids=[1], temperature=0.0),
        make_request("ignore", output=[], eos=0, min_tokens=2, ignore_eos=True, temperature=0.0),
    ]
    assert sample(requests, logits) == [2, 0, 0]


def test_greedy_and_random_rows_mix() -> None:
    logits = torch.tensor([[0.0, 0.0, 3.0], [0.0, 0.0, 3.0]])
    requests = [make_request("g", temperature=0.0), make_request("r", temperature=1.0, top_k=1)]
    assert sample(requests, logits) == [2, 2]


def test_seeded_sampling_is_reproducible_and_independent_of_batch_mates() -> None:
    torch.manual_seed(0)
    vocab = 50
    logits_a = torch.randn(8, vocab)
    alone: dict[str, torch.Generator] = {}
    crowded: dict[str, torch.Generator] = {}
    tokens_alone, tokens_crowded = [], []
    for step in range(8):
        a = make_request("a", seed=1234, temperature=0.9, top_p=0.95)
        tokens_alone += sample([a], logits_a[step : step + 1], alone, seed=step)
        mates = [make_request("m1", temperature=1.0), make_request("m2", seed=7, temperature=1.5, top_k=5), a]
        batch = torch.cat([torch.randn(2, vocab), logits_a[step : step + 1]])
        tokens_crowded.append(sample(mates, batch, crowded, seed=100 + step)[2])
    assert tokens_alone == tokens_crowded
    other: dict[str, torch.Generator] = {}
    different_seed = [sample([make_request("a", seed=99, temperature=0.9, top_p=0.95)], logits_a[s : s + 1], other)[0]
                      for s in range(8)]
    assert different_seed != tokens_alone  # 8 draws over ~50 tokens: equal only by a huge coincidence


def test_random_sampling_follows_the_tempered_distribution() -> None:
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    rows = 20000
    logits = (probs.log() * 2.0).repeat(rows, 1)  # temperature 2 undoes the ×2
    requests = [make_request(str(i), temperature=2.0) for i in range(rows)]
    counts = torch.bincount(torch.tensor(sample(requests, logits)), minlength=4).float() / rows
    assert torch.allclose(counts, probs, atol=0.02)


def test_two_level_inverse_cdf_is_exact_across_blocks_and_a_ragged_vocab() -> None:
    vocab, rows = 600, 8000  # 600 = 2 full blocks of 256 + a padded one
    chosen = torch.tensor([5, 100, 300, 599])
    probs = torch.tensor([0.1, 0.4, 0.2, 0.3])
    logits = torch.full((rows, vocab), NEG_INF)
    logits[:, chosen] = probs.log()
    sampled = sample_categorical(logits, torch.rand(rows, 2, generator=torch.Generator().manual_seed(3)))
    counts = torch.bincount(sampled, minlength=vocab).float() / rows
    assert counts.sum() == 1.0 and counts[chosen].sum() == 1.0  # zero-weight tokens never picked
    assert torch.allclose(counts[chosen], probs, atol=0.025)
    edges = torch.tensor([[0.0, 0.0], [0.999999, 0.999999]])
    assert sample_categorical(logits[:2], edges).tolist() == [5, 599]


def test_logprobs_sampled_token_then_top_n_from_raw_logits() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0], [1.0, 3.0, 2.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    requests = [
        make_request("a", temperature=0.0, logprobs=2, presence_penalty=2.0, output=[1]),  # penalty moves argmax
        make_request("b", temperature=0.0, logprobs=0),
        make_request("c", temperature=0.0),
    ]
    metadata = SamplingMetadata.build(requests, 4, CPU, {})
    out = Sampler(CPU)(logits, metadata)
    raw = torch.log_softmax(logits, dim=-1)
    assert out.sampled_token_ids == [2, 1, 3]
    a, b, c = out.logprobs
    assert [(lp.token_id, lp.rank) for lp in a] == [(2, 2), (1, 1), (2, 2)]
    assert a[0].logprob == pytest.approx(raw[0, 2].item()) and a[1].logprob == pytest.approx(raw[0, 1].item())
    assert [(lp.token_id, lp.rank) for lp in b] == [(1, 1)] and c is None
    assert math.isclose(sum(math.exp(v) for v in raw[0].tolist()), 1.0, rel_tol=1e-6)


def test_grammar_bitmask_allows_only_set_bits() -> None:
    vocab = 40
    bitmask = torch.zeros(2, 2, dtype=torch.int32)
    bitmask[0, 0] = 1 << 3
    bitmask[0, 1] = 1 << 2  # token 34
    bitmask[1] = -1  # all allowed
    out = apply_token_bitmask(torch.zeros(2, vocab), bitmask)
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [3, 34]
    assert torch.isfinite(out[1]).all()
    metadata = SamplingMetadata.build([make_request("a", temperature=0.0)], vocab, CPU, {})
    metadata.grammar_bitmask = bitmask[:1]
    assert Sampler(CPU)(torch.arange(vocab, dtype=torch.float32).unsqueeze(0), metadata).sampled_token_ids == [34]


def test_a_complete_grammar_wins_over_min_tokens() -> None:
    vocab = 32
    bitmask = torch.full((2, 1), -1, dtype=torch.int32)
    bitmask[0, 0] = 1 << 7  # the grammar is complete: only EOS (7) is allowed
    requests = [make_request(r, output=[3], eos=7, min_tokens=4, temperature=0.0) for r in ("complete", "open")]
    metadata = SamplingMetadata.build(requests, vocab, CPU, {})
    metadata.grammar_bitmask = bitmask
    logits = torch.zeros(2, vocab)
    logits[:, 7] = 9.0  # EOS is the favourite of both rows
    logits[:, 5] = 1.0
    # The complete row stops; the open row still has min_tokens ban EOS.
    assert Sampler(CPU)(logits, metadata).sampled_token_ids == [7, 5]


def test_a_seeded_request_with_several_rows_draws_them_in_position_order() -> None:
    """The seed rule for multi-token steps: k + 1 rows of one request in one step consume its generator exactly
    as k + 1 single-row steps would, whatever shares the batch."""
    torch.manual_seed(5)
    logits = torch.randn(3, 40)
    one_step_generators: dict = {}
    a = make_request("a", seed=42, temperature=0.8)
    mate = make_request("m", temperature=1.0)
    rows = [mate, a, a, a]  # a verifies 2 drafts: 3 rows
    metadata = SamplingMetadata.build(rows, 40, CPU, one_step_generators, draft_prefixes=[[], [], [7], [7, 8]])
    batch = torch.cat([torch.randn(1, 40), logits])
    together = Sampler(CPU, 0)(batch, metadata).sampled_token_ids[1:]
    step_generators: dict = {}
    one_by_one = [sample([a], logits[row : row + 1], step_generators, seed=row)[0] for row in range(3)]
    assert together == one_by_one


def test_rows_after_drafts_see_them_as_output_for_penalties_and_min_tokens() -> None:
    request = make_request("a", prompt=[1], output=[], min_tokens=2, frequency_penalty=1.0, stop_token_ids=[3])
    metadata = SamplingMetadata.build([request] * 3, 6, CPU, {}, draft_prefixes=[[], [4], [4, 4]])
    assert metadata.output_token_ids is not None
    assert metadata.output_token_ids.tolist() == [[6, 6], [4, 6], [4, 4]]  # padded with vocab_size
    assert metadata.min_tokens_mask is not None
    rows, token_ids = metadata.min_tokens_mask
    assert sorted(set(rows.tolist())) == [0, 1] and set(token_ids.tolist()) == {0, 3}  # row 2 has 2 outputs


def test_draw_uniforms_gives_seeded_rows_their_own_stream() -> None:
    cpu = torch.device("cpu")
    engine_wide = torch.Generator(device=cpu).manual_seed(0)
    uniforms = draw_uniforms(engine_wide, {1: torch.Generator(device=cpu).manual_seed(7)}, 3, cpu)
    assert uniforms.shape == (3, 2)
    assert torch.equal(uniforms[1], torch.rand(2, generator=torch.Generator(device=cpu).manual_seed(7)))
    unseeded = torch.rand(3, 2, generator=torch.Generator(device=cpu).manual_seed(0))
    assert torch.equal(uniforms[[0, 2]], unseeded[[0, 2]])
