"""ModelRunner against HF transformers: greedy decoding through the paged KV cache, block sizing."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.config import ConfigError, EngineConfig
from engine.model_runner import ModelRunner
from engine.request import Request
from engine.sampling_params import SamplingParams
from engine.scheduler_output import ScheduledRequest, SchedulerOutput

GIB = 2**30


def schedule(request: Request, num_new: int, block_ids: list[int], drafts: list[int] | None = None) -> ScheduledRequest:
    """As the scheduler plans a request: it samples when the known tokens reach the end of its tokens."""
    drafts = drafts or []
    sample = request.num_computed_tokens + num_new >= request.num_tokens
    return ScheduledRequest(request, num_new + len(drafts), block_ids, sample, drafts)


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    runner = ModelRunner(EngineConfig.from_kwargs(model="tiny-random", max_model_len=256, block_size=4))
    runner.initialize_kv_cache(200)
    return runner


@pytest.fixture(scope="module")
def hf_model(runner: ModelRunner) -> AutoModelForCausalLM:
    return AutoModelForCausalLM.from_pretrained(runner.model_path, dtype=torch.float32).eval()


def greedy_with_runner(
    runner: ModelRunner, prompts: list[list[int]], max_tokens: int, chunk: int, arrivals: list[int]
) -> list[list[int]]:
    """A minimal scheduler: request i joins at step arrivals[i]; prefills run in chunks of `chunk` tokens.

    Blocks are handed out in a scrambled order so block tables are not contiguous.
    """
    bs = runner.block_size
    free_blocks = list(range(runner.num_blocks))[::-1]
    free_blocks = free_blocks[::2] + free_blocks[1::2]
    requests = [Request(str(i), p, SamplingParams(max_tokens=max_tokens)) for i, p in enumerate(prompts)]
    blocks: dict[str, list[int]] = {r.request_id: [] for r in requests}
    step = 0
    while any(r.num_output_tokens < max_tokens for r in requests):
        scheduled = []
        for request, arrival in zip(requests, arrivals, strict=True):
            if arrival > step or request.num_output_tokens >= max_tokens:
                continue
            num_new = min(chunk, request.num_tokens - request.num_computed_tokens)
            table = blocks[request.request_id]
            while len(table) * bs < request.num_computed_tokens + num_new:
                table.append(free_blocks.pop())
            scheduled.append(schedule(request, num_new, list(table)))
        output = SchedulerOutput(scheduled, sum(s.num_scheduled_tokens for s in scheduled))
        sampling = output.sampling_requests()
        logits = runner.execute_model(output)
        assert logits.shape == (len(sampling), runner.vocab_size) and logits.dtype == torch.float32
        for s in scheduled:
            s.request.num_computed_tokens += s.num_scheduled_tokens
        for s, row in zip(sampling, logits, strict=True):
            s.request.output_token_ids.append(int(row.argmax()))
        step += 1
    return [r.output_token_ids for r in requests]


def test_greedy_matches_hf_with_staggered_arrivals_and_chunked_prefill(
    runner: ModelRunner, hf_model: AutoModelForCausalLM
) -> None:
    generator = torch.Generator().manual_seed(7)
    lengths = [1, 3, 5, 9, 13, 17, 24, 31]
    prompts = [torch.randint(3, runner.vocab_size, (n,), generator=generator).tolist() for n in lengths]
    max_tokens = 12
    ours = greedy_with_runner(runner, prompts, max_tokens, chunk=6, arrivals=[0, 0, 1, 2, 2, 5, 7, 8])
    for prompt, output in zip(prompts, ours, strict=True):
        expected = hf_model.generate(
            torch.tensor([prompt]), max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False
        )[0, len(prompt) :].tolist()
        assert output == expected
    assert any(len(set(o)) > 3 for o in ours), "tiny-random should not decode one repeated token"


def test_logits_match_hf_for_a_mixed_prefill_and_decode_step(
    runner: ModelRunner, hf_model: AutoModelForCausalLM
) -> None:
    """One step mixing a decode, a later prefill chunk (with cached context) and a fresh prefill."""
    first = Request("a", list(range(100, 110)), SamplingParams())
    second = Request("b", list(range(200, 221)), SamplingParams())
    warm = SchedulerOutput([schedule(first, 10, [1, 2, 3]), schedule(second, 8, [4, 5])], 18)
    runner.execute_model(warm)
    first.num_computed_tokens, second.num_computed_tokens = 10, 8
    first.output_token_ids.append(321)
    third = Request("c", list(range(300, 307)), SamplingParams())
    step = SchedulerOutput(
        [
            schedule(first, 1, [1, 2, 3]),
            schedule(second, 13, [4, 5, 6, 7, 8, 9]),
            schedule(third, 7, [10, 11]),
        ],
        21,
    )
    logits = runner.execute_model(step)
    with torch.inference_mode():
        for row, request in zip(logits, (first, second, third), strict=True):
            reference = hf_model(torch.tensor([request.all_token_ids])).logits[0, -1]
            torch.testing.assert_close(row, reference, atol=1e-4, rtol=1e-4)


def test_a_verification_step_returns_one_row_per_draft_equal_to_hf(
    runner: ModelRunner, hf_model: AutoModelForCausalLM
) -> None:
    """The last known token and 3 drafts run at consecutive positions; row j is HF's logits after draft j-1."""
    request = Request("v", list(range(400, 411)), SamplingParams())
    runner.execute_model(SchedulerOutput([schedule(request, 10, [30, 31, 32, 33])], 10))
    request.num_computed_tokens = 10
    drafts = [501, 502, 503]
    logits = runner.execute_model(SchedulerOutput([schedule(request, 1, [30, 31, 32, 33], drafts)], 4))
    assert logits.shape == (4, runner.vocab_size)
    with torch.inference_mode():
        reference = hf_model(torch.tensor([request.all_token_ids + drafts])).logits[0, -4:]
    torch.testing.assert_close(logits, reference, atol=1e-4, rtol=1e-4)


def test_partial_prefill_chunk_samples_nothing(runner: ModelRunner) -> None:
    request = Request("p", list(range(50, 70)), SamplingParams())
    logits = runner.execute_model(SchedulerOutput([schedule(request, 8, [20, 21])], 8))
    assert logits.shape == (0, runner.vocab_size)


def test_dtype_and_eos_resolution(runner: ModelRunner) -> None:
    assert runner.device.type == "cpu" and runner.dtype == torch.float32
    assert runner.eos_token_ids == [2] and runner.max_model_len == 256


def test_num_blocks_override_and_cap(caplog: pytest.LogCaptureFixture) -> None:
    config = EngineConfig.from_kwargs(model="tiny-random", num_gpu_blocks_override=37)
    with caplog.at_level(logging.INFO, logger="engine.model_runner"):
        assert ModelRunner(config).determine_num_blocks() == 37
    assert "KV cache: 37 blocks of 16 tokens = 592 tokens" in caplog.text  # how many blocks and tokens fit
    capped = ModelRunner(EngineConfig.from_kwargs(model="tiny-random", max_model_len=64, max_num_seqs=3))
    assert capped.determine_num_blocks() == 3 * 64 // 16


def test_profile_run_covers_the_token_budget_and_keeps_the_cache_bound() -> None:
    """The profiling forward the cuda sizing uses: max_num_batched_tokens split into max_model_len sequences."""
    runner = ModelRunner(EngineConfig.from_kwargs(model="tiny-random", max_model_len=64, max_num_batched_tokens=200))
    runner.initialize_kv_cache(8)
    calls: list[int] = []
    runner.model.register_forward_pre_hook(lambda _, args: calls.append(args[0].numel()))
    runner.profile_run()
    assert calls == [200]
    request = Request("after", [5, 6, 7], SamplingParams())
    logits = runner.execute_model(SchedulerOutput([schedule(request, 3, [0])], 3))
    assert logits.shape == (1, runner.vocab_size) and torch.isfinite(logits).all()


def test_kv_cache_too_small_for_one_sequence_is_a_clear_error() -> None:
    runner = ModelRunner(EngineConfig.from_kwargs(model="tiny-random", gpu_memory_utilization=1e-9))
    with pytest.raises(ConfigError, match="max-model-len"):
        runner.determine_num_blocks()


def test_max_model_len_beyond_the_model_is_rejected() -> None:
    with pytest.raises(ConfigError, match="context length"):
        ModelRunner(EngineConfig.from_kwargs(model="tiny-random", max_model_len=10**6))


def _memory(monkeypatch: pytest.MonkeyPatch, before: int, after: int) -> None:
    """MemAvailable reads before the weights load, then after (before - after went to the weights)."""
    available = iter([before, after])
    monkeypatch.setattr("engine.model_runner._mem_available_bytes", lambda: next(available))


def test_cpu_memory_fraction_covers_weights_activations_and_kv(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where gpu_memory_utilization's budget is below the default cap, it decides."""
    _memory(monkeypatch, 8 * GIB, 7 * GIB)  # 1 GiB went to the weights
    runner = ModelRunner(EngineConfig.from_kwargs(model="tiny-random", gpu_memory_utilization=0.3))
    budget = runner.kv_cache_budget()
    assert budget.bytes == int(0.3 * 8 * GIB - 1 * GIB - runner._cpu_activation_bytes())  # 1.4 GiB < the 2 GiB cap
    assert budget.limit.startswith("gpu_memory_utilization=0.3")


@pytest.mark.parametrize(("before", "expected"), [(64 * GIB, 4 * GIB), (8 * GIB, 2 * GIB)])
def test_cpu_default_cap_is_the_smaller_of_4_gib_and_a_quarter_of_free_ram(
    monkeypatch: pytest.MonkeyPatch, before: int, expected: int
) -> None:
    """The issue's 24 GiB machine gave 0.9 x MemAvailable (19.7 GiB) to the KV cache; the default is now at most
    4 GiB, and a quarter of the free RAM where that is less."""
    _memory(monkeypatch, before, before - GIB)
    runner = ModelRunner(EngineConfig.from_kwargs(model="tiny-random"))
    budget = runner.kv_cache_budget()
    assert budget.bytes == expected
    assert budget.limit.startswith("the CPU default, min(4.00 GiB, 0.25 x MemAvailable")


def test_cpu_default_cap_is_shared_by_the_tensor_parallel_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    _memory(monkeypatch, 64 * GIB, 63 * GIB)
    runner = ModelRunner(EngineConfig.from_kwargs(model="tiny-random"))

    class TwoRanks:  # the group a rank of tensor_parallel_size=2 sees; the other rank is already at the barrier
        world_size = 2

        def barrier(self) -> None:
            pass

    monkeypatch.setattr("engine.model_runner.get_tp_group", TwoRanks)
    budget = runner.kv_cache_budget()
    assert budget.bytes == 2 * GIB and budget.limit.endswith("/ 2 ranks; set --kv-cache-memory-bytes to change it")


def test_explicit_kv_cache_memory_bytes_overrides_the_default_and_the_utilization(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _memory(monkeypatch, 64 * GIB, 63 * GIB)
    runner = ModelRunner(EngineConfig.from_kwargs(
        model="tiny-random", max_model_len=64, kv_cache_memory_bytes="1MiB", gpu_memory_utilization=1e-9,
    ))  # fmt: skip
    with caplog.at_level(logging.INFO, logger="engine.model_runner"):
        num_blocks = runner.determine_num_blocks()
    assert num_blocks == 2**20 // runner.block_bytes
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("KV cache:"))
    assert f"KV cache: {num_blocks} blocks of 16 tokens" in line
    assert f"{num_blocks * runner.block_bytes / 2**20:.1f} MiB per rank" in line
    assert line.endswith("limit: kv_cache_memory_bytes=1.0 MiB")


def test_the_start_up_line_names_the_max_num_seqs_cap(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _memory(monkeypatch, 64 * GIB, 63 * GIB)
    runner = ModelRunner(EngineConfig.from_kwargs(model="tiny-random", max_model_len=64, max_num_seqs=2))
    with caplog.at_level(logging.INFO, logger="engine.model_runner"):
        assert runner.determine_num_blocks() == 2 * 64 // runner.block_size
    assert "limit: max_num_seqs=2 x max_model_len=64, under the CPU default" in caplog.text


def test_kv_cache_memory_bytes_beyond_the_free_ram_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _memory(monkeypatch, 8 * GIB, 7 * GIB)
    runner = ModelRunner(EngineConfig.from_kwargs(model="tiny-random", kv_cache_memory_bytes=16 * GIB))
    with pytest.raises(ConfigError, match=r"kv_cache_memory_bytes=16.00 GiB per rank x 1 rank\(s\) exceeds the RAM"):
        runner.kv_cache_budget()


def test_kv_cache_memory_bytes_too_small_for_one_sequence_names_the_knob(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = ModelRunner(EngineConfig.from_kwargs(model="tiny-random", kv_cache_memory_bytes=1024))
    with pytest.raises(ConfigError, match=r"KV cache \(kv_cache_memory_bytes=1024 bytes\) has room for 0 tokens"):
        runner.determine_num_blocks()


def test_world_size_1_kv_cache_holds_every_kv_head(runner: ModelRunner) -> None:
    """One process is the whole tensor-parallel group: attention and the KV cache get every head."""
    arch, backend = runner.arch, runner.attn_backend
    assert (backend.num_heads, backend.num_kv_heads) == (arch.num_attention_heads, arch.num_key_value_heads)
    assert runner.kv_caches[0].shape == backend.kv_cache_shape(200)
    kv_bytes_per_token = 2 * arch.num_key_value_heads * arch.head_dim * runner.dtype.itemsize
    assert runner.block_bytes == arch.num_hidden_layers * kv_bytes_per_token * runner.block_size
