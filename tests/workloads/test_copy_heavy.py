"""The copy-heavy workload: seeded, cycling through its tasks, and every prompt holds the passage it talks about."""

from __future__ import annotations

import pytest

import workloads
from workloads.copy_heavy import TASKS, copy_heavy


def test_seeded_and_cycles_through_the_tasks() -> None:
    requests = workloads.load_texts("copy-heavy", num_requests=7, seed=3, output_len=64)
    assert requests == copy_heavy(7, 3, output_len=64) and requests != copy_heavy(7, 4, output_len=64)
    assert [r.task for r in requests] == [TASKS[i % 3] for i in range(7)]
    assert all(r.output_len == 64 and r.prompt.startswith("Passage:\n\n") for r in requests)
    for request in requests:
        passage = request.prompt.split("\n\n")[1]
        assert 5 <= passage.count(".") <= 9
        if request.task == "edit":  # the word to replace is in the passage
            word = request.prompt.split("'")[1]
            assert f" {word}" in passage


def test_bad_input_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown text workload 'copy'"):
        workloads.load_texts("copy", num_requests=1)
    with pytest.raises(ValueError, match="num_requests and output_len must be >= 1"):
        copy_heavy(0)
