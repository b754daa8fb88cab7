"""Rejection sampling keeps the target's distribution: chi-square on an 8-token vocabulary, greedy rows, seeds."""

from __future__ import annotations

import torch

from engine.engine_core import accept_drafts
from engine.request import Request
from engine.sampler import Sampler, SamplingMetadata
from engine.sampling_params import SamplingParams
from engine.spec_decode.rejection_sampler import rejection_sample

VOCAB = 8


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's test of observed counts against expected probabilities (cells with p > 0)."""
    expected = probs * counts.sum()
    keep = probs > 0
    assert int(counts[~keep].sum()) == 0, "a token of probability 0 was emitted"
    statistic = ((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), statistic.double() / 2))


def run(
    p_rows: torch.Tensor, q_rows: torch.Tensor, num_requests: int, seed: int = 0, params: SamplingParams | None = None
) -> list[list[int]]:
    """num_requests requests, each verifying len(q_rows) drafts drawn from q_rows against target rows p_rows
    (one more row than drafts: the bonus row), with engine seed `seed`. Returns each request's accepted tokens."""
    k = q_rows.shape[0]
    generator = torch.Generator().manual_seed(1000)
    drafts = torch.stack([torch.multinomial(q, num_requests, replacement=True, generator=generator) for q in q_rows], 1)
    params = params or SamplingParams(temperature=1.0)
    requests = [Request(f"r{i}", [0], params) for i in range(num_requests)]
    rows = [r for r in requests for _ in range(k + 1)]
    metadata = SamplingMetadata.build(rows, VOCAB, torch.device("cpu"), {})
    logits = p_rows.log().repeat(num_requests, 1)
    draft_tokens = [t for request_drafts in drafts.tolist() for t in [*request_drafts, None]]
    draft_probs = [q for _ in range(num_requests) for q in [*q_rows, None]]
    output = rejection_sample(Sampler(torch.device("cpu"), seed), logits, metadata, draft_tokens, draft_probs)
    tokens = output.sampled_token_ids
    return [accept_drafts(d, tokens[i * (k + 1) : (i + 1) * (k + 1)]) for i, d in enumerate(drafts.tolist())]


def distributions(seed: int, rows: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    probs = torch.rand(rows, VOCAB, generator=generator) ** 3
    probs[:, 0] = 0.0  # a token the target never emits
    return probs / probs.sum(-1, keepdim=True)


def test_every_position_has_the_target_distribution() -> None:
    p, q = distributions(1, 3), distributions(2, 2)
    q[0, 0] = 0.2  # the draft proposes a token the target never emits
    q[0] /= q[0].sum()
    accepted = run(p, q, num_requests=6000)
    for position in range(3):
        # Token `position` of a run is drawn from p[position] given the run reached it (p rows don't depend on
        # history here), whatever the drafts were.
        tokens = torch.tensor([run_[position] for run_ in accepted if len(run_) > position])
        assert len(tokens) > 300
        counts = torch.bincount(tokens, minlength=VOCAB).double()
        assert chi_square_p_value(counts, p[position].double()) > 1e-3, position
    lengths = torch.bincount(torch.tensor([len(r) for r in accepted]))
    assert lengths[1] > 0 and lengths[3] > 0  # both rejections and full acceptances (with the bonus token)


def test_acceptance_rate_is_the_overlap_of_p_and_q() -> None:
    p, q = distributions(3, 2), distributions(4, 1)
    accepted = run(p, q, num_requests=6000)
    rate = sum(len(r) > 1 for r in accepted) / len(accepted)
    assert abs(rate - float(torch.minimum(p[0], q[0]).sum())) < 0.03


def test_greedy_rows_take_the_argmax_and_seeds_repeat() -> None:
    p, q = distributions(5, 3), distributions(6, 2)
    greedy = run(p, q, 50, params=SamplingParams(temperature=0.0))
    argmax = p.argmax(-1).tolist()
    for tokens in greedy:
        assert tokens == argmax[: len(tokens)]
    seeded = SamplingParams(temperature=1.0, seed=9)
    assert run(p, q, 40, seed=1, params=seeded) == run(p, q, 40, seed=2, params=seeded)  # the request's own seed
    assert run(p, q, 40, seed=1) != run(p, q, 40, seed=2)
