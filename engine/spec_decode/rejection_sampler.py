"""Exact rejection sampling of draft-model drafts (Leviathan et al. / Chen et al.), in the sampler's row layout.

Rows are the sampler's: a request that verifies k drafts has k + 1 consecutive logits rows. For a sampled request
whose drafts came with their draft distributions q, draft j (drawn from q_j) is accepted with probability
min(1, p_j(x) / q_j(x)), p_j being the target's distribution at row j after every logits processor (penalties,
temperature, min-p, top-k, top-p), exactly as the sampler would sample it. At the first rejection the token is
drawn from normalise(max(p_j - q_j, 0)); when every draft is accepted the bonus token is drawn from p_k. The
emitted tokens are then distributed exactly as sampling p token by token would give.

Rows of greedy requests, and drafts without q (point masses: n-gram drafts), keep the sampler's own result: the
target's argmax, or a sample from p, which engine.engine_core.accept_drafts compares with the draft.

Randomness is the sampler's (engine.sampler.draw_uniforms): two uniforms per row, rows in position order, seeded
requests from their own generator. Row j's first uniform u decides acceptance (u < p/q); after a rejection
(u - p/q) / (1 - p/q) is a fresh uniform, which with the second one draws the replacement token.
"""

from __future__ import annotations

import torch

from engine.sampler import (
    Sampler,
    SamplerOutput,
    SamplingMetadata,
    draw_uniforms,
    gather_logprobs,
    process_logits,
    sample_categorical,
    warp_logits,
)


def rejection_sample(
    sampler: Sampler,
    logits: torch.Tensor,
    metadata: SamplingMetadata,
    draft_tokens: list[int | None],
    draft_probs: list[torch.Tensor | None],
) -> SamplerOutput:
    """Sample every row; a row with a draft token and its q row (`draft_tokens[i]`, `draft_probs[i]`) is verified
    by rejection sampling: its result is the draft when accepted, else the replacement token (never the draft).

    The output has the sampler's shape, so accept_drafts turns each request's rows into its accepted tokens.
    """
    logits, raw_logprobs = process_logits(logits, metadata)
    greedy = logits.argmax(dim=-1)
    if metadata.all_greedy:
        tokens = greedy
    else:
        logits, is_greedy = warp_logits(logits, metadata)
        uniforms = draw_uniforms(sampler.generator, metadata.generators, logits.shape[0], logits.device)
        tokens = _verify(logits, uniforms, draft_tokens, draft_probs)
        tokens = torch.where(is_greedy, greedy, tokens)
    logprobs = gather_logprobs(raw_logprobs, tokens, metadata.num_logprobs) if raw_logprobs is not None else None
    return SamplerOutput(tokens.tolist(), logprobs or [None] * len(metadata.num_logprobs))


def _verify(
    logits: torch.Tensor,
    uniforms: torch.Tensor,
    draft_tokens: list[int | None],
    draft_probs: list[torch.Tensor | None],
) -> torch.Tensor:
    """Per row: the draft if accepted, else a draw from the residual; rows without q draw from p."""
    verified = [row for row, q in enumerate(draft_probs) if q is not None and draft_tokens[row] is not None]
    if not verified:
        return sample_categorical(logits, uniforms)
    p = logits.softmax(dim=-1)
    rows = torch.tensor(verified, device=logits.device)
    q = torch.stack([draft_probs[row] for row in verified]).to(p)  # type: ignore[misc]
    x = torch.tensor([draft_tokens[row] for row in verified], device=logits.device).unsqueeze(1)
    p_rows = p[rows]
    ratio = (p_rows.gather(1, x) / q.gather(1, x)).squeeze(1)
    u = uniforms[rows, 0]
    accepted = u < ratio
    residual = (p_rows - q).clamp_(min=0.0)
    # A residual of total mass 0 means p == q on the row, where u < ratio = 1 always accepts; p keeps it finite.
    residual = torch.where(residual.sum(dim=-1, keepdim=True) > 0, residual, p_rows)
    fresh = ((u - ratio) / (1.0 - ratio).clamp(min=1e-12)).clamp(0.0, 1.0 - 1e-7)
    replacement = sample_categorical(residual.log(), torch.stack([fresh, uniforms[rows, 1]], dim=1))
    tokens = sample_categorical(logits, uniforms)
    return tokens.index_copy(0, rows, torch.where(accepted, x.squeeze(1), replacement))
