"""NgramProposer against a loop-by-loop reference: longest n first, the latest earlier occurrence, up to k tokens."""

from __future__ import annotations

import random

import pytest

from engine.spec_decode.ngram_proposer import NgramProposer


def reference(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    for n in range(max_n, min_n - 1, -1):
        if len(tokens) <= n:
            continue
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


@pytest.mark.parametrize(("k", "min_n", "max_n"), [(1, 1, 1), (3, 1, 3), (4, 2, 4), (5, 3, 5)])
def test_matches_the_reference_on_a_batch(k: int, min_n: int, max_n: int) -> None:
    rng = random.Random(k * 10 + min_n)
    batch = [[rng.randrange(4) for _ in range(rng.randrange(0, 40))] for _ in range(64)]
    got = NgramProposer(k, min_n, max_n).propose(batch)
    assert got == [reference(tokens, k, min_n, max_n) for tokens in batch]
    assert any(got) and not all(got)


def test_examples() -> None:
    proposer = NgramProposer(3, 1, 3)
    assert proposer.propose([[1, 2, 3, 4, 1, 2], [5, 6, 7], [9], [1, 2, 3, 1, 2, 3, 1, 2]]) == [
        [3, 4, 1],  # "1 2" occurred at 0: the tokens after it
        [],  # nothing recurs
        [],
        [3, 1, 2],  # the latest earlier "3 1 2", at 2, wins over the one at 5's overlap
    ]
    assert proposer.propose([]) == []
