"""One engine step flattened for the model: what every tensor-parallel rank needs to run it, and nothing more.

`prepare_model_input` turns a SchedulerOutput (which holds Request objects) into a `ModelInput` of plain integer
arrays, on the driver. The in-process ModelRunner runs it directly; the multiprocess executor pickles it once and
sends the same bytes to every rank (engine/executor/multiproc_executor.py), so all ranks run an identical step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.request import Request
from engine.scheduler_output import SchedulerOutput


@dataclass
class ModelInput:
    """A flat batch of `num_tokens` tokens from `len(query_lens)` sequences (see engine/attention/backend.py)."""

    input_ids: np.ndarray  # [num_tokens] int64
    positions: np.ndarray  # [num_tokens] int64
    slot_mapping: np.ndarray  # [num_tokens] int64: the KV slot each token's K/V is written to
    entered_blocks: np.ndarray  # blocks this step writes at offset 0: zeroed before the forward pass
    query_lens: list[int]
    seq_lens: list[int]  # context including this step's tokens
    block_tables: list[list[int]]
    sample_rows: np.ndarray  # [num logits rows] int64: the tokens whose logits the sampler needs, in order

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)


def _token_slice(request: Request, start: int, count: int) -> list[int]:
    """request.all_token_ids[start:start+count] without concatenating prompt and output lists."""
    prompt, num_prompt = request.prompt_token_ids, request.num_prompt_tokens
    if start >= num_prompt:
        return request.output_token_ids[start - num_prompt : start - num_prompt + count]
    tokens = prompt[start : start + count]
    if start + count > num_prompt:
        tokens = tokens + request.output_token_ids[: start + count - num_prompt]
    return tokens


def prepare_model_input(scheduler_output: SchedulerOutput, block_size: int) -> ModelInput:
    """Every scheduled request's known tokens from `num_computed_tokens` on, then its drafts, at consecutive
    positions; per request the rows of `scheduler_output.logits_rows`: its prompt-logprob rows (from its first known
    token), then its sampling rows (the last known token's, then one per draft)."""
    input_ids: list[int] = []
    query_lens: list[int] = []
    context_lens: list[int] = []
    block_tables: list[list[int]] = []
    flat_block_ids: list[int] = []
    sample_rows: list[int] = []
    layout = scheduler_output.logits_rows
    for scheduled, prompt_rows, num_sample_rows in zip(
        scheduler_output.scheduled, layout.num_prompt_logprobs_rows, layout.num_sample_rows, strict=True
    ):
        request, num_new, drafts = scheduled.request, scheduled.num_scheduled_tokens, scheduled.spec_token_ids
        computed = request.num_computed_tokens
        input_ids += _token_slice(request, computed, num_new - len(drafts)) + drafts
        query_lens.append(num_new)
        context_lens.append(computed)
        block_tables.append(scheduled.block_ids)
        flat_block_ids += scheduled.block_ids
        sample_rows += range(len(input_ids) - num_new, len(input_ids) - num_new + prompt_rows)
        sample_rows += range(len(input_ids) - num_sample_rows, len(input_ids))
    num_tokens = len(input_ids)
    q_lens = np.array(query_lens, dtype=np.int64)
    # positions: for token t of request r, context_lens[r] + (t - first token of r)
    seq_index = np.repeat(np.arange(len(query_lens)), q_lens)
    first_token = np.cumsum(q_lens) - q_lens
    offset_of_seq = first_token - np.array(context_lens, dtype=np.int64)
    positions = np.arange(num_tokens, dtype=np.int64) - offset_of_seq[seq_index]
    table_starts = np.cumsum([0] + [len(t) for t in block_tables[:-1]], dtype=np.int64)
    blocks = np.array(flat_block_ids, dtype=np.int64)[table_starts[seq_index] + positions // block_size]
    offsets = positions % block_size
    return ModelInput(
        input_ids=np.array(input_ids, dtype=np.int64),
        positions=positions,
        slot_mapping=blocks * block_size + offsets,
        entered_blocks=blocks[offsets == 0],
        query_lens=query_lens,
        seq_lens=[c + n for c, n in zip(context_lens, query_lens, strict=True)],
        block_tables=block_tables,
        sample_rows=np.array(sample_rows, dtype=np.int64),
    )
