"""prompt_logprobs equal HF transformers' log-softmax of the same prompt (float32, 1e-4), across prefill chunks,
batched with other requests, with prefix caching on, and for n > 1."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine import LLM, SamplingParams
from engine.model_files import resolve_model
from engine.outputs import Logprob
from engine.prompt_logprobs import prompt_logprob_entries
from engine.sampling_params import SamplingParamsError

PROMPTS = [list(range(100, 170)), list(range(300, 341)), [5, 6]]


@pytest.fixture(scope="module")
def hf_logprobs() -> list[torch.Tensor]:
    hf = AutoModelForCausalLM.from_pretrained(resolve_model("tiny-random"), dtype=torch.float32).eval()
    with torch.inference_mode():
        return [torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1) for ids in PROMPTS]


@pytest.fixture(scope="module")
def llm() -> LLM:
    # 32-token steps: the 70-token prompt's logprobs come from three prefill chunks.
    return LLM("tiny-random", dtype="float32", max_model_len=256, max_num_batched_tokens=32, max_num_seqs=4)


def check_against_hf(prompt_logprobs: list, ids: list[int], reference: torch.Tensor, num: int) -> None:
    assert len(prompt_logprobs) == len(ids) and prompt_logprobs[0] is None
    for position in range(1, len(ids)):
        entry, row = prompt_logprobs[position], reference[position - 1]
        token = ids[position]
        assert list(entry)[0] == token  # the prompt token first, then the top-N
        assert abs(entry[token].logprob - float(row[token])) < 1e-4
        assert entry[token].rank == int((row > row[token]).sum()) + 1
        top_values, top_ids = row.topk(num)
        for rank, (value, top_id) in enumerate(zip(top_values.tolist(), top_ids.tolist(), strict=True), start=1):
            assert entry[top_id].rank in (rank, entry[token].rank) and abs(entry[top_id].logprob - value) < 1e-4
        assert len(entry) == num + (token not in top_ids.tolist())


def test_prompt_logprobs_equal_hf_across_chunks_and_batches(llm: LLM, hf_logprobs: list[torch.Tensor]) -> None:
    params = SamplingParams(max_tokens=3, temperature=0.0, prompt_logprobs=2)
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in PROMPTS], params, use_tqdm=False)
    for output, ids, reference in zip(outputs, PROMPTS, hf_logprobs, strict=True):
        assert output.prompt_logprobs is not None
        check_against_hf(output.prompt_logprobs, ids, reference, 2)


def test_cached_prefixes_are_recomputed_for_prompt_logprobs(llm: LLM, hf_logprobs: list[torch.Tensor]) -> None:
    plain = SamplingParams(max_tokens=1)
    llm.generate({"prompt_token_ids": PROMPTS[0]}, plain, use_tqdm=False)  # its blocks are now cached
    output = llm.generate({"prompt_token_ids": PROMPTS[0]}, SamplingParams(max_tokens=1, prompt_logprobs=0), False)
    assert output[0].prompt_logprobs is not None
    check_against_hf(output[0].prompt_logprobs, PROMPTS[0], hf_logprobs[0], 0)


def test_n_completions_share_one_prompt_logprobs_list(llm: LLM, hf_logprobs: list[torch.Tensor]) -> None:
    params = SamplingParams(n=2, max_tokens=2, seed=1, prompt_logprobs=1)
    (output,) = llm.generate({"prompt_token_ids": PROMPTS[1]}, params, use_tqdm=False)
    assert len(output.outputs) == 2 and output.prompt_logprobs is not None
    check_against_hf(output.prompt_logprobs, PROMPTS[1], hf_logprobs[1], 1)


def test_without_the_field_there_are_none(llm: LLM) -> None:
    (output,) = llm.generate({"prompt_token_ids": PROMPTS[2]}, SamplingParams(max_tokens=1), use_tqdm=False)
    assert output.prompt_logprobs is None


def test_entries_by_hand() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.25], [0.1, 0.2, 0.7]]))
    entries = prompt_logprob_entries(logits, [1, 2], 1)
    assert entries[0] == {1: Logprob(1, pytest.approx(-1.3862944), 2), 0: Logprob(0, pytest.approx(-0.6931472), 1)}
    assert entries[1] == {2: Logprob(2, pytest.approx(-0.3566749), 1)}


@pytest.mark.parametrize("value", [-1, 21])
def test_out_of_range_is_refused_naming_the_field(value: int) -> None:
    with pytest.raises(SamplingParamsError, match="prompt_logprobs must be in"):
        SamplingParams(prompt_logprobs=value)
