"""Tensor parallelism end to end: `LLM(..., tensor_parallel_size=N)` runs N worker processes whose greedy output is
token-identical to HF transformers (float32) with prefix caching, chunked prefill and preemption all on; a killed
rank fails the engine with its rank, and a killed driver leaves no rank behind.

One 2-rank tiny-random engine serves the whole module (starting ranks is the slow part); the test that kills one
of its ranks runs last.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine import LLM, SamplingParams
from engine.executor.multiproc_executor import EngineDeadError, MultiprocExecutor
from engine.model_files import resolve_model
from engine.tokenizer import get_tokenizer

pytestmark = pytest.mark.slow  # spawned ranks each import torch and load their shard: seconds per engine

REPO = Path(__file__).resolve().parents[3]
SHARED_PREFIX = (
    "You are a careful assistant. Read the following note about the history of paged memory in operating "
    "systems and answer briefly. Note: virtual memory maps pages to frames through a page table."
)
TEXTS = [
    SHARED_PREFIX + " Question: what is a page?",
    SHARED_PREFIX + " Question: who invented it?",
    SHARED_PREFIX + " Question: why do frames help?",
    "Hi",
    "The capital of France is",
    "List five prime numbers, explain why each is prime, and then describe the sieve of Eratosthenes.",
]
BLOCK_SIZE = 16


def hf_greedy(model: str, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """HF transformers' float32 greedy continuation of each prompt (no EOS: exactly max_tokens tokens)."""
    hf = AutoModelForCausalLM.from_pretrained(resolve_model(model), dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None
    expected = []
    with torch.inference_mode():
        for ids in prompts:
            input_ids = torch.tensor([ids])
            out = hf.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_tokens,
                              do_sample=False, pad_token_id=0)  # fmt: skip
            expected.append(out[0, len(ids) :].tolist())
    return expected


def generate(llm: LLM, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params, use_tqdm=False)
    return [out.outputs[0].token_ids for out in outputs]


def assert_same(got: list[list[int]], expected: list[list[int]]) -> None:
    for index, (ours, theirs) in enumerate(zip(got, expected, strict=True)):
        assert ours == theirs, f"prompt {index}: engine {ours} != HF {theirs}"


@dataclass
class Engine:
    llm: LLM
    prompts: list[list[int]]
    expected: list[list[int]]
    max_tokens: int

    @property
    def executor(self) -> MultiprocExecutor:
        executor = self.llm.llm_engine.engine_core.model_executor
        assert isinstance(executor, MultiprocExecutor)
        return executor


@pytest.fixture(scope="module")
def tp2() -> Iterator[Engine]:
    max_tokens = 20
    tokenizer = get_tokenizer("tiny-random")
    prompts = [tokenizer.encode(text) for text in TEXTS]
    longest = max(len(p) for p in prompts) + max_tokens
    llm = LLM(
        "tiny-random", tensor_parallel_size=2, dtype="float32", max_model_len=256, block_size=BLOCK_SIZE,
        enable_prefix_caching=True, enable_chunked_prefill=True, max_num_batched_tokens=32,
        num_gpu_blocks_override=-(-longest // BLOCK_SIZE) + 3,  # room for the longest request, not for all at once
    )  # fmt: skip
    engine = Engine(llm, prompts, hf_greedy("tiny-random", prompts, max_tokens), max_tokens)
    yield engine
    engine.executor.shutdown()


def test_two_ranks_match_hf_with_prefix_caching_chunked_prefill_and_preemption(tp2: Engine) -> None:
    llm = tp2.llm
    first = generate(llm, tp2.prompts[:1], tp2.max_tokens)
    before = llm.llm_engine.get_stats()
    rest = generate(llm, tp2.prompts[1:], tp2.max_tokens)
    after = llm.llm_engine.get_stats()
    assert_same(first + rest, tp2.expected)
    assert after.prefix_cache_hits - before.prefix_cache_hits >= 2 * BLOCK_SIZE  # prompts 1-2 reuse prompt 0's
    assert after.num_preemptions > before.num_preemptions


def test_the_step_payload_is_slim_and_collective_time_is_measured(tp2: Engine) -> None:
    executor = tp2.executor
    assert executor.tensor_parallel_size == 2 and len(executor._processes) == 2
    stats = executor.stats.per_step()
    # a 32-token step is a few hundred bytes of integers; a pickled Request would bring its prompt and params
    assert 0 < stats["step_payload_bytes"] < 2048
    assert stats["logits_bytes"] > 0 and executor.stats.num_steps > 0
    assert executor.stats.collective_seconds > 0


def test_a_killed_rank_fails_the_engine_with_its_rank_and_leaves_no_rank(tp2: Engine) -> None:
    executor = tp2.executor
    pids = [process.pid for process in executor._processes]
    os.kill(pids[1], signal.SIGKILL)
    with pytest.raises(EngineDeadError, match=r"rank 1 \(pid \d+\) died: killed by SIGKILL"):
        generate(tp2.llm, tp2.prompts[:1], 2)
    assert not any(process.is_alive() for process in executor._processes)
    with pytest.raises(EngineDeadError, match="rank 1"):  # and every later call says the same
        executor.check_health()


DRIVER = textwrap.dedent(
    """
    import json, sys, time
    from engine import LLM, SamplingParams

    if __name__ == "__main__":
        prompts, max_tokens = json.loads(sys.argv[1]), int(sys.argv[2])
        llm = LLM("smollm2-135m", tensor_parallel_size=3, dtype="float32", max_model_len=128,
                  max_num_batched_tokens=32, num_gpu_blocks_override=32)
        print(json.dumps([p.pid for p in llm.llm_engine.engine_core.model_executor._processes]), flush=True)
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params, use_tqdm=False)
        print(json.dumps([out.outputs[0].token_ids for out in outputs]), flush=True)
        time.sleep(600)
    """
)


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_three_ranks_of_the_default_model_match_hf_and_a_killed_driver_leaves_no_rank(tmp_path: Path) -> None:
    """One driver process: its greedy output equals HF's (computed here meanwhile), then it is SIGKILLed."""
    tokenizer = get_tokenizer("smollm2-135m")
    prompts = [tokenizer.encode(text) for text in TEXTS[2:5]]
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    command = [sys.executable, str(script), json.dumps(prompts), "8"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    driver = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True, env=env)
    try:
        expected = hf_greedy("smollm2-135m", prompts, 8)
        assert driver.stdout is not None
        pids = json.loads(driver.stdout.readline())
        assert_same(json.loads(driver.stdout.readline()), expected)
        assert len(pids) == 3 and all(pid_alive(pid) for pid in pids)
        driver.kill()
        driver.wait(timeout=30)
        deadline = time.monotonic() + 15
        while any(pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(pid_alive(pid) for pid in pids), "a rank outlived its driver"
    finally:
        driver.kill()
        driver.wait()
