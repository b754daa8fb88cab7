"""Prompt-lookup (n-gram) drafts, computed for the whole batch in one set of tensor ops.

For each request the longest n in [prompt_lookup_min, prompt_lookup_max] whose final n tokens occurred earlier in
its prompt + output wins; the drafts are the (up to k) tokens that followed the latest such occurrence. A draft is
a point mass (q = 1 on the proposed token), which engine.engine_core.accept_drafts verifies exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class NgramProposer:
    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int) -> None:
        assert 1 <= prompt_lookup_min <= prompt_lookup_max and num_speculative_tokens >= 1
        self.k = num_speculative_tokens
        self.min_n = prompt_lookup_min
        self.max_n = prompt_lookup_max

    def propose(self, token_ids: Sequence[Sequence[int]]) -> list[list[int]]:
        """Up to k drafts per sequence (an empty list where no n-gram of the allowed sizes recurs)."""
        if not token_ids:
            return []
        lengths = torch.tensor([len(t) for t in token_ids])
        width = int(lengths.max())
        # Left-padded with -1 (never a token id), so every sequence's last n tokens are the last n columns.
        padded = torch.full((len(token_ids), width), -1, dtype=torch.int64)
        for row, tokens in enumerate(token_ids):
            if tokens:
                padded[row, width - len(tokens) :] = torch.as_tensor(tokens, dtype=torch.int64)
        best_start = torch.full((len(token_ids),), -1, dtype=torch.int64)  # where the drafts begin, per row
        found = torch.zeros(len(token_ids), dtype=torch.bool)
        positions = torch.arange(width)
        for n in range(min(self.max_n, width - 1), self.min_n - 1, -1):
            # Window s covers columns [s, s + n); the last window is the suffix itself, so it is left out.
            windows = padded.unfold(1, n, 1)[:, :-1]
            matches = (windows == padded[:, -n:].unsqueeze(1)).all(dim=-1) & (lengths > n).unsqueeze(1)
            latest = torch.where(matches, positions[: windows.shape[1]], -1).amax(dim=1)
            take = ~found & (latest >= 0)
            best_start = torch.where(take, latest + n, best_start)
            found |= take
        drafts: list[list[int]] = []
        for row, start in enumerate(best_start.tolist()):
            drafts.append(padded[row, start : start + self.k].tolist() if start >= 0 else [])
        return drafts
