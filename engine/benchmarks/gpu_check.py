"""`bench check gpu` (`make gpu-check`): one command that checks and times the engine's CUDA path.

1. Every Triton kernel against a torch reference (engine/benchmarks/kernel_checks.py), float32 and bfloat16.
2. Greedy output of the engine (triton backend, float32) against HF transformers `generate`, token for token.
3. Decode step time against the HBM roofline at batch 1 and 32: the roofline step time is the bytes a
   decode step must read (every weight once, plus each sequence's KV) over the copy bandwidth measured
   here (a device-to-device copy; read + write bytes over time).
4. Triton paged decode attention against torch SDPA over the same K/V held dense (SDPA's best case).

It exits with status 1 when a kernel check or the greedy comparison fails. It needs a CUDA device: on the
CPU the kernels only run interpreted, which the test suite does (TRITON_INTERPRET=1).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import typer

WARMUP_DECODE_STEPS = 2
GREEDY_TEXTS = [
    "The capital of France is",
    "List five prime numbers and explain why each is prime.",
    "Écris une phrase courte sur les chats.",
    "def fibonacci(n):",
]


@dataclass
class GreedyComparison:
    prompt_index: int
    engine_tokens: list[int]
    hf_tokens: list[int]

    @property
    def first_mismatch(self) -> int | None:
        pairs = zip(self.engine_tokens, self.hf_tokens, strict=True)
        return next((i for i, (ours, theirs) in enumerate(pairs) if ours != theirs), None)


@dataclass
class DecodeRoofline:
    batch_size: int
    context_len: int  # mean context of the timed steps
    step_time_s: float  # one engine step: schedule, forward, sample
    weight_bytes: int
    kv_bytes: int  # KV read by one step, all sequences and layers
    bandwidth_bytes_per_s: float

    @property
    def roofline_step_time_s(self) -> float:
        return (self.weight_bytes + self.kv_bytes) / self.bandwidth_bytes_per_s

    @property
    def roofline_fraction(self) -> float:
        return self.roofline_step_time_s / self.step_time_s


@dataclass
class GpuCheckReport:
    device: str
    kernel_checks: list[dict[str, Any]] = field(default_factory=list)
    greedy: list[dict[str, Any]] = field(default_factory=list)
    decode_roofline: list[dict[str, Any]] = field(default_factory=list)
    attention_timing: dict[str, float] = field(default_factory=dict)
    passed: bool = True


def _synchronize(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], Any], device: Any, min_seconds: float = 0.2, min_iterations: int = 3) -> float:
    """Mean seconds per call of `fn` after one warm-up call, synchronising the device around the loop."""
    fn()
    _synchronize(device)
    iterations, start = 0, time.perf_counter()
    while iterations < min_iterations or time.perf_counter() - start < min_seconds:
        fn()
        iterations += 1
        if iterations >= min_iterations:
            _synchronize(device)
    _synchronize(device)
    return (time.perf_counter() - start) / iterations


def measure_copy_bandwidth(device: Any, num_bytes: int = 2**30) -> float:
    """Bytes per second a device-to-device copy moves (read + write), on `num_bytes`-sized buffers."""
    import torch

    src = torch.empty(num_bytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / time_call(lambda: dst.copy_(src), device)


def decode_step_bytes(runner: Any, batch_size: int, context_len: int) -> tuple[int, int]:
    """(weight bytes, KV bytes) one decode step reads: every weight tensor once (parameters, and the CPU's
    oneDNN-prepacked copies that replace them) except the input embedding table, of which a decode reads
    batch_size rows (counted when the LM head shares it); plus batch_size sequences of context_len tokens of
    K and V in every layer."""
    import torch

    model = runner.model
    tensors = {id(p): p for p in model.parameters()}  # parameters() yields a shared (tied) tensor once
    for module in model.modules():
        packed = getattr(module, "packed_weight", None)
        if isinstance(packed, torch.Tensor):
            tensors[id(packed)] = packed
    embedding = model.embed_tokens.weight
    if model.lm_head.weight is not embedding:
        tensors.pop(id(embedding), None)
    weight_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
    kv_bytes = batch_size * context_len * runner.block_bytes // runner.block_size
    return weight_bytes, kv_bytes


def measure_decode_step(llm: Any, batch_size: int, prompt_len: int, steps: int) -> float:
    """Mean seconds of an engine step while `batch_size` requests of `prompt_len` tokens all decode (after
    WARMUP_DECODE_STEPS untimed ones)."""
    from engine import SamplingParams

    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=steps + 2 + WARMUP_DECODE_STEPS, ignore_eos=True)
    for i in range(batch_size):
        engine.add_request(f"gpu-check-{batch_size}-{i}", [(7 * i + j) % 1000 + 100 for j in range(prompt_len)], params)
    started: set[str] = set()
    while len(started) < batch_size:  # prefill until every request has its first token
        started.update(output.request_id for output in engine.step() if output.outputs[0].token_ids)
    for _ in range(WARMUP_DECODE_STEPS):  # the first decode steps compile the decode kernels
        engine.step()
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    elapsed = time.perf_counter() - start
    while engine.has_unfinished_requests():
        engine.step()
    return elapsed / steps


def decode_roofline(llm: Any, batch_size: int, prompt_len: int, steps: int, bandwidth: float) -> DecodeRoofline:
    runner = llm.llm_engine.engine_core.model_executor
    step_time = measure_decode_step(llm, batch_size, prompt_len, steps)
    context_len = prompt_len + 1 + WARMUP_DECODE_STEPS + steps // 2
    weight_bytes, kv_bytes = decode_step_bytes(runner, batch_size, context_len)
    return DecodeRoofline(batch_size, context_len, step_time, weight_bytes, kv_bytes, bandwidth)


def compare_greedy_with_hf(
    model: str, device: Any, max_tokens: int, attention_backend: str, texts: list[str] = GREEDY_TEXTS
) -> list[GreedyComparison]:
    """float32 greedy tokens of the engine and of HF `generate` (no EOS) for each text."""
    import torch
    from transformers import AutoModelForCausalLM

    from engine import LLM, SamplingParams
    from engine.model_files import resolve_model

    llm = LLM(model, dtype="float32", device=device.type, max_model_len=512, attention_backend=attention_backend)
    tokenizer = llm.get_tokenizer()
    prompts = [tokenizer.encode(text) for text in texts]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params, use_tqdm=False)
    del llm
    hf = AutoModelForCausalLM.from_pretrained(resolve_model(model), dtype=torch.float32).to(device).eval()
    hf.generation_config.eos_token_id = None
    comparisons = []
    with torch.inference_mode():
        for index, (ids, output) in enumerate(zip(prompts, outputs, strict=True)):
            input_ids = torch.tensor([ids], device=device)
            generated = hf.generate(
                input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_tokens, do_sample=False,
                pad_token_id=0,
            )  # fmt: skip
            hf_tokens = generated[0, len(ids) :].tolist()
            comparisons.append(GreedyComparison(index, list(output.outputs[0].token_ids), hf_tokens))
    return comparisons


def time_decode_attention(
    device: Any, dtype: Any, batch_size: int, context_len: int, num_heads: int, num_kv_heads: int, head_dim: int,
    block_size: int = 16,
) -> dict[str, float]:  # fmt: skip
    """Seconds per call of the Triton paged decode kernel and of torch SDPA on the same K/V held dense."""
    import torch
    import torch.nn.functional as F

    from engine.attention.ops.triton_paged_attention import paged_decode_attention
    from engine.benchmarks.kernel_checks import paged_cache

    k = torch.randn(batch_size, context_len, num_kv_heads, head_dim, device=device).to(dtype)
    v = torch.randn_like(k)
    cache, tables = paged_cache([(k[i], v[i]) for i in range(batch_size)], block_size, dtype)
    q = torch.randn(batch_size, num_heads, head_dim, device=device).to(dtype)
    out = torch.empty_like(q)
    lens = torch.full((batch_size,), context_len, dtype=torch.int32, device=device)
    rows = torch.arange(batch_size, dtype=torch.int32, device=device)
    scale = head_dim**-0.5
    dense_k, dense_v, dense_q = k.transpose(1, 2), v.transpose(1, 2), q[:, :, None]

    def triton_call() -> None:
        paged_decode_attention(q, cache, tables, lens, rows, out, scale, context_len)

    def sdpa_call() -> None:
        F.scaled_dot_product_attention(dense_q, dense_k, dense_v, scale=scale, enable_gqa=True)

    return {"triton_paged_decode_s": time_call(triton_call, device), "torch_sdpa_s": time_call(sdpa_call, device)}


def gpu_check(
    model: str = typer.Option("smollm2-135m", help="Model of the greedy comparison and the roofline."),
    greedy_tokens: int = typer.Option(32, help="Greedy tokens compared with HF per prompt."),
    decode_steps: int = typer.Option(32, help="Timed decode steps per batch size."),
    prompt_len: int = typer.Option(256, help="Prompt tokens of the roofline requests."),
    output_json: Path | None = typer.Option(None, help="Write the report here as JSON."),
) -> None:
    """Check every Triton kernel against torch, greedy output against HF, and time decode against the HBM
    roofline (batch 1 and 32) and Triton attention against SDPA. Needs a CUDA device."""
    import torch

    if not torch.cuda.is_available():
        typer.echo("error: bench check gpu needs a CUDA device (torch sees none)", err=True)
        raise typer.Exit(1)
    from engine import LLM
    from engine.benchmarks.kernel_checks import run_kernel_checks
    from engine.model_files import load_hf_config, resolve_model
    from engine.models import ArchConfig

    device = torch.device("cuda")
    report = GpuCheckReport(device=torch.cuda.get_device_name(device))
    typer.echo(f"[1/4] Triton kernels vs torch on {report.device}")
    for dtype in (torch.float32, torch.bfloat16):
        for check in run_kernel_checks(device, dtype):
            report.kernel_checks.append({**asdict(check), "dtype": str(dtype), "passed": check.passed})
            report.passed &= check.passed
            mark = "ok  " if check.passed else "FAIL"
            typer.echo(f"  {mark} {dtype} {check.name}: max abs error {check.max_abs_error:.2e}")
    typer.echo(f"[2/4] greedy tokens vs HF transformers ({model}, float32, {greedy_tokens} tokens)")
    for comparison in compare_greedy_with_hf(model, device, greedy_tokens, "triton"):
        mismatch = comparison.first_mismatch
        report.greedy.append({**asdict(comparison), "first_mismatch": mismatch})
        report.passed &= mismatch is None
        typer.echo(f"  {'ok  ' if mismatch is None else 'FAIL'} prompt {comparison.prompt_index}: "
                   + ("identical" if mismatch is None else f"first mismatch at token {mismatch}"))  # fmt: skip
    bandwidth = measure_copy_bandwidth(device)
    typer.echo(f"[3/4] decode step vs HBM roofline (copy bandwidth {bandwidth / 1e9:.0f} GB/s)")
    llm = LLM(model, max_num_seqs=32, max_model_len=prompt_len + decode_steps + 8, attention_backend="triton")
    for batch_size in (1, 32):
        roofline = decode_roofline(llm, batch_size, prompt_len, decode_steps, bandwidth)
        report.decode_roofline.append({**asdict(roofline), "roofline_fraction": roofline.roofline_fraction})
        typer.echo(
            f"  batch {batch_size:>2}: {roofline.step_time_s * 1e3:.2f} ms/step, roofline "
            f"{roofline.roofline_step_time_s * 1e3:.3f} ms ({(roofline.weight_bytes + roofline.kv_bytes) / 1e6:.0f} MB)"
            f" = {100 * roofline.roofline_fraction:.1f} % of roofline"
        )
    del llm
    arch = ArchConfig.from_hf(load_hf_config(resolve_model(model)))
    typer.echo("[4/4] Triton paged decode attention vs torch SDPA (dense K/V), bfloat16, batch 32 x 1024 tokens")
    report.attention_timing = time_decode_attention(
        device, torch.bfloat16, 32, 1024, arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim
    )
    timing = report.attention_timing
    typer.echo(f"  triton {timing['triton_paged_decode_s'] * 1e6:.1f} us, sdpa {timing['torch_sdpa_s'] * 1e6:.1f} us")
    if output_json is not None:
        output_json.parent.mkdir(parents=True, exist_ok=True)
        output_json.write_text(json.dumps(asdict(report), indent=2) + "\n")
    typer.echo("gpu-check: " + ("passed" if report.passed else "FAILED"))
    if not report.passed:
        raise typer.Exit(1)
