"""prepare_model_input: a SchedulerOutput flattened into the integer arrays every rank runs, by hand."""

from __future__ import annotations

import pickle

import numpy as np

from engine.model_input import prepare_model_input
from engine.request import Request
from engine.sampling_params import SamplingParams
from engine.scheduler_output import ScheduledRequest, SchedulerOutput


def test_a_prefill_chunk_and_a_decode_with_a_draft() -> None:
    chunked = Request("a", list(range(100, 110)), SamplingParams())
    chunked.num_computed_tokens = 2  # tokens 2..7 run now, 8..9 in a later step: no sample row
    decoding = Request("b", [1, 2, 3, 4, 5], SamplingParams(), output_token_ids=[6])
    decoding.num_computed_tokens = 5  # its last output token runs now, followed by the draft 42
    output = SchedulerOutput(
        scheduled=[
            ScheduledRequest(chunked, 6, block_ids=[3, 7], sample=False),
            ScheduledRequest(decoding, 2, block_ids=[2, 5], sample=True, spec_token_ids=[42]),
        ],
        total_num_scheduled_tokens=8,
    )
    step = prepare_model_input(output, block_size=4)
    assert step.input_ids.tolist() == [102, 103, 104, 105, 106, 107, 6, 42]
    assert step.positions.tolist() == [2, 3, 4, 5, 6, 7, 5, 6]
    # slot = block_ids[position // 4] * 4 + position % 4
    assert step.slot_mapping.tolist() == [14, 15, 28, 29, 30, 31, 21, 22]
    assert step.entered_blocks.tolist() == [7]  # only block 7 is written from its offset 0 on
    assert (step.query_lens, step.seq_lens, step.block_tables) == ([6, 2], [8, 7], [[3, 7], [2, 5]])
    assert step.sample_rows.tolist() == [6, 7]  # the decode's last known token, then its draft
    assert all(isinstance(value, np.ndarray | list) for value in vars(step).values())  # no Request objects
    assert len(pickle.dumps(step)) < 1500
