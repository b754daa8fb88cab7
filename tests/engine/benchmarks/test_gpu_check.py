"""`bench check gpu`'s parts on the CPU: the kernel checks (interpreted Triton, small shapes, and one broken
kernel they must catch), the roofline arithmetic by hand, the decode timing loop, the greedy comparison, and
the command's refusal without CUDA."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are defined: triton.jit reads it then

import math  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from cli import app  # noqa: E402
from engine import LLM  # noqa: E402
from engine.benchmarks import gpu_check, kernel_checks  # noqa: E402

CPU = torch.device("cpu")


def test_kernel_checks_pass_for_the_kernels() -> None:
    checks = kernel_checks.run_kernel_checks(CPU, torch.float32, length=8, head_dim=16, groups=(3,), block_sizes=(16,))
    names = [c.name for c in checks]
    assert [n.split()[0] for n in names] == ["kv", "decode", "decode", "prefill", "add+rmsnorm", "silu*mul"]
    assert "partition=32 " in names[1] and "partition=64 " in names[2]  # split-K, then one partition
    assert all(c.passed for c in checks), [(c.name, c.max_abs_error) for c in checks if not c.passed]


def test_kernel_checks_catch_a_wrong_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.attention.ops import triton_paged_attention

    real = triton_paged_attention.paged_decode_attention

    def off_by_a_little(*args: object) -> None:
        real(*args)
        args[5][0, 0, 0] += 1e-3  # type: ignore[index]  # out

    monkeypatch.setattr(triton_paged_attention, "paged_decode_attention", off_by_a_little)
    check = kernel_checks.check_decode(1, 16, 32, [5, 20], 16, torch.float32, CPU)
    assert not check.passed and check.max_abs_error == pytest.approx(1e-3, rel=1e-2)
    assert not kernel_checks.KernelCheck("nan", float("nan"), 1.0).passed


def test_roofline_arithmetic_by_hand() -> None:
    roofline = gpu_check.DecodeRoofline(
        batch_size=2, context_len=10, step_time_s=0.004, weight_bytes=3_000_000, kv_bytes=1_000_000,
        bandwidth_bytes_per_s=2e9,
    )  # fmt: skip
    assert roofline.roofline_step_time_s == pytest.approx(0.002)
    assert roofline.roofline_fraction == pytest.approx(0.5)
    comparison = gpu_check.GreedyComparison(0, [1, 2, 3, 4], [1, 2, 5, 4])
    assert comparison.first_mismatch == 2
    assert gpu_check.GreedyComparison(1, [1, 2], [1, 2]).first_mismatch is None


@pytest.fixture(scope="module")
def tiny_llm() -> LLM:
    return LLM("tiny-random", dtype="float32", device="cpu", max_model_len=128, attention_backend="torch")


def test_decode_step_bytes_of_tiny_random(tiny_llm: LLM) -> None:
    runner = tiny_llm.llm_engine.engine_core.model_executor
    weight_bytes, kv_bytes = gpu_check.decode_step_bytes(runner, batch_size=3, context_len=10)
    # tiny-random: hidden 64, intermediate 128, 2 layers, 4 heads / 2 KV heads of 16, vocab 49152, untied
    per_layer = 64 * (64 + 2 * 32) + 64 * 64 + 64 * 2 * 128 + 128 * 64 + 2 * 64
    assert weight_bytes == 4 * (2 * per_layer + 64 + 49152 * 64)  # + final norm + LM head; no embedding table
    assert kv_bytes == 3 * 10 * (2 * 2 * 2 * 16 * 4)  # sequences x tokens x (layers x K,V x heads x dim x 4 B)


def test_decode_roofline_runs_the_batch_to_the_end(tiny_llm: LLM) -> None:
    bandwidth = gpu_check.measure_copy_bandwidth(CPU, num_bytes=2**20)
    roofline = gpu_check.decode_roofline(tiny_llm, batch_size=3, prompt_len=20, steps=4, bandwidth=bandwidth)
    assert roofline.context_len == 20 + 1 + gpu_check.WARMUP_DECODE_STEPS + 2 and roofline.batch_size == 3
    assert math.isfinite(roofline.roofline_fraction) and roofline.roofline_fraction > 0
    assert not tiny_llm.llm_engine.has_unfinished_requests()


def test_greedy_comparison_with_hf_on_tiny_random() -> None:
    comparisons = gpu_check.compare_greedy_with_hf("tiny-random", CPU, 4, "torch", texts=["Hello there", "A b c"])
    assert len(comparisons) == 2
    assert all(c.first_mismatch is None and len(c.hf_tokens) == 4 for c in comparisons)


def test_attention_timing_runs_both_kernels() -> None:
    timing = gpu_check.time_decode_attention(CPU, torch.float32, 2, 20, 4, 2, 16)
    assert set(timing) == {"triton_paged_decode_s", "torch_sdpa_s"} and all(t > 0 for t in timing.values())


def test_the_command_refuses_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = CliRunner().invoke(app, ["check", "gpu"])
    assert result.exit_code == 1 and "needs a CUDA device" in result.output
