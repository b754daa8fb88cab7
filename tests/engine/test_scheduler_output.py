"""LogitsRows: the step's logits row layout (prompt-logprob rows, then 1 + k sampling rows per request), by hand."""

from __future__ import annotations

from engine.request import Request
from engine.sampling_params import SamplingParams
from engine.scheduler_output import LogitsRows, ScheduledRequest, SchedulerOutput


def test_prompt_logprob_rows_then_sampling_rows_per_request() -> None:
    # a: a whole 6-token prompt with prompt logprobs: rows for positions 0..4, then its sampling row.
    a = Request("a", list(range(6)), SamplingParams(prompt_logprobs=2))
    # b: a prefill chunk (positions 0..3 of 10) that samples nothing, with prompt logprobs: 4 rows.
    b = Request("b", list(range(10)), SamplingParams(prompt_logprobs=0))
    # c: a decode verifying two drafts: 1 + 2 sampling rows.
    c = Request("c", [1, 2, 3], SamplingParams(), output_token_ids=[4])
    c.num_computed_tokens = 3
    # d: a decode without drafts.
    d = Request("d", [1, 2], SamplingParams(), output_token_ids=[3])
    d.num_computed_tokens = 2
    scheduled = [
        ScheduledRequest(a, 6, [], sample=True),
        ScheduledRequest(b, 4, [], sample=False),
        ScheduledRequest(c, 3, [], sample=True, spec_token_ids=[7, 8]),
        ScheduledRequest(d, 1, [], sample=True),
    ]
    output = SchedulerOutput(scheduled, 14)
    rows = output.logits_rows
    assert rows == LogitsRows.of(scheduled)
    assert rows.num_prompt_logprobs_rows == (5, 4, 0, 0)
    assert rows.num_sample_rows == (1, 0, 3, 1)
    assert rows.prompt_logprobs_starts == (0, 6, 10, 13)
    assert (rows.num_rows, rows.num_sampling_rows) == (14, 5)
    assert rows.sample_starts == (0, 1, 4)  # per sampling request: a, c, d
    assert [rows.sample_rows(i) for i in range(3)] == [slice(0, 1), slice(1, 4), slice(4, 5)]
    assert rows.output_sample_rows() == [5, 10, 11, 12, 13]
    assert rows.has_prompt_logprobs


def test_without_prompt_logprobs_the_rows_are_the_sampling_rows() -> None:
    request = Request("a", [1, 2, 3], SamplingParams())
    rows = SchedulerOutput([ScheduledRequest(request, 3, [], sample=True, spec_token_ids=[])], 3).logits_rows
    assert (rows.num_rows, rows.num_sampling_rows, rows.has_prompt_logprobs) == (1, 1, False)
    assert rows.output_sample_rows() == [0]
    empty = SchedulerOutput().logits_rows
    assert (empty.num_rows, empty.sample_starts, empty.output_sample_rows()) == (0, (), [])
