"""The measurement behind `bench throughput`: offline throughput like vLLM's, of our engine or HF transformers.

Both backends get the same prompts: random token ids of exactly input_len tokens (special tokens
excluded), and each request produces exactly output_len tokens (EOS ignored); a text workload's requests
(engine backend only) are chat prompts that end at EOS or output_len. vLLM's definitions:
requests_per_second = num_requests / elapsed_time, tokens_per_second = (prompt + output tokens) /
elapsed_time, output_tokens_per_second = output tokens / elapsed_time; elapsed_time covers generation
only (model loading and KV allocation excluded).

Roofline (engine backend): the command times the model's own linear-layer matmul shapes at 512 rows in
the run's dtype, with torch's F.linear and (CPU) with the prepacked oneDNN linear the engine uses, and
takes the best GFLOP/s of either (both are in the JSON: on AMD CPUs MKL's float32 GEMM reaches about half
of oneDNN's). Model FLOPs of a run =
2 * non_embedding_params * total_num_tokens + 2 * vocab_size * hidden_size * total_output_tokens
(the LM head runs once per sampled token; attention score FLOPs are left out, <10 % at these lengths),
so roofline_fraction = achieved GFLOP/s / roofline GFLOP/s, and roofline_tokens_per_second is the
total tok/s the machine would reach at the roofline.

Per request (engine backend): TPOT = (finished - first token) / (output tokens - 1) on the engine clock, so
prefill is left out (at --max-num-seqs 1 its inverse is batch-1 decode speed); the result has the mean and the
median. With speculation on: vLLM's acceptance figures from the engine's spec-decode counters over the timed run,
acceptance rate = accepted / draft tokens, mean acceptance length = 1 + accepted / drafts, and per draft position
i the fraction of drafts whose token i was accepted. Greedy runs (temperature 0) record a SHA-256 of every
request's output token ids, so runs of different knobs can be checked token-identical.
"""

from __future__ import annotations

import copy
import hashlib
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# workloads.load's shape: (workload, num_requests=, seed=, input_len=, output_len=, max_model_len=) -> specs with
# input_len and output_len; workloads.load_texts's: (workload, num_requests=, seed=, output_len=) -> requests with
# prompt (text) and output_len. The engine imports no workloads code: cli.py hands the loaders in.
WorkloadLoader = Callable[..., Sequence[Any]]


@dataclass(frozen=True)
class WorkloadLoaders:
    lengths: WorkloadLoader
    texts: WorkloadLoader


@dataclass
class BenchRequest:
    prompt_token_ids: list[int]
    output_len: int  # the most output tokens; exactly this many when ignore_eos
    ignore_eos: bool = True
    temperature: float = 1.0


@dataclass
class ThroughputResult:
    backend: str
    model: str
    dtype: str
    num_requests: int
    elapsed_time: float
    total_num_tokens: int
    total_output_tokens: int
    requests_per_second: float
    tokens_per_second: float
    output_tokens_per_second: float
    roofline_gflops: float | None = None  # the best kernel's; matmul_gflops has every kernel's
    roofline_kernel: str | None = None
    matmul_gflops: dict[str, float] | None = None
    model_gflop: float | None = None
    achieved_gflops: float | None = None
    roofline_fraction: float | None = None
    roofline_tokens_per_second: float | None = None
    tensor_parallel_size: int = 1
    # With tensor_parallel_size > 1, means per step (engine/executor/multiproc_executor.py TensorParallelStats)
    tp_step_payload_bytes: float | None = None
    tp_logits_bytes: float | None = None
    tp_step_ms: float | None = None
    tp_execute_ms: float | None = None
    tp_collective_ms: float | None = None
    mean_tpot_ms: float | None = None  # per request, engine backend (module docstring)
    median_tpot_ms: float | None = None
    acceptance_rate: float | None = None  # speculation on only
    mean_acceptance_length: float | None = None
    acceptance_rate_per_position: list[float] | None = None
    greedy_output_sha256: str | None = None  # every request's output token ids, when all are greedy

    @classmethod
    def measure(
        cls, backend: str, model: str, dtype: str, requests: list[BenchRequest], output_lens: list[int], elapsed: float
    ) -> Any:
        prompt = sum(len(r.prompt_token_ids) for r in requests)
        output = sum(output_lens)
        return cls(
            backend=backend,
            model=model,
            dtype=dtype,
            num_requests=len(requests),
            elapsed_time=elapsed,
            total_num_tokens=prompt + output,
            total_output_tokens=output,
            requests_per_second=len(requests) / elapsed,
            tokens_per_second=(prompt + output) / elapsed,
            output_tokens_per_second=output / elapsed,
        )


def make_requests(
    tokenizer: Any, num_prompts: int, lengths: list[tuple[int, int]], vocab_size: int, seed: int,
    temperature: float = 1.0,
) -> list[BenchRequest]:
    import numpy as np

    special = set(tokenizer.all_special_ids)
    candidates = np.array([t for t in range(min(len(tokenizer), vocab_size)) if t not in special])
    rng = np.random.default_rng(seed)
    return [
        BenchRequest(rng.choice(candidates, size=input_len).tolist(), output_len, temperature=temperature)
        for input_len, output_len in lengths[:num_prompts]
    ]


def chat_prompt_ids(tokenizer: Any, text: str) -> list[int]:
    """The prompt as the chat endpoint would render it, or the raw text for a tokenizer without a template."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                            add_generation_prompt=True)  # fmt: skip
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    return list(tokenizer.encode(text))


def model_flops(arch: Any, total_tokens: int, output_tokens: int) -> float:
    h, inter = arch.hidden_size, arch.intermediate_size
    q, kv = arch.num_attention_heads * arch.head_dim, arch.num_key_value_heads * arch.head_dim
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * inter
    non_embedding = arch.num_hidden_layers * per_layer
    return 2.0 * non_embedding * total_tokens + 2.0 * arch.vocab_size * h * output_tokens


def measure_roofline_gflops(
    arch: Any, dtype: Any, device: Any, rows: int = 512, seconds: float = 0.3
) -> dict[str, float]:
    """Best GFLOP/s over the model's linear-layer shapes, x[rows, in] @ W[in, out], per available matmul kernel."""
    import torch

    from engine.layers.onednn import onednn_linear, onednn_linear_available, onednn_prepack

    h, inter = arch.hidden_size, arch.intermediate_size
    q, kv = arch.num_attention_heads * arch.head_dim, arch.num_key_value_heads * arch.head_dim
    kernels = {"torch_linear": lambda x, w: torch.nn.functional.linear(x, w)}
    if device.type == "cpu" and onednn_linear_available(dtype):
        kernels["onednn_prepacked"] = lambda x, w: onednn_linear(x, w, None)
    best = dict.fromkeys(kernels, 0.0)
    for in_features, out_features in ((h, q + 2 * kv), (q, h), (h, 2 * inter), (inter, h)):
        x = torch.randn(rows, in_features, dtype=dtype, device=device)
        w = torch.randn(out_features, in_features, dtype=dtype, device=device)
        for name, kernel in kernels.items():
            weight = onednn_prepack(w) if name == "onednn_prepacked" else w
            kernel(x, weight)
            iterations, start = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - start) < seconds or iterations < 3:
                kernel(x, weight)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                iterations += 1
            flops = 2.0 * rows * in_features * out_features * iterations / elapsed / 1e9
            best[name] = max(best[name], flops)
    return best


def run_engine(
    model: str, requests: list[BenchRequest], knobs: dict[str, Any], warmup: bool = False
) -> ThroughputResult:
    """One engine with `knobs` serves `requests` in one `generate` call; `warmup` serves one short request first,
    untimed (so the process's one-time start-up costs do not fall on whichever engine runs first)."""
    from engine import LLM, SamplingParams

    llm = LLM(model, **knobs)
    if warmup:
        first = requests[0]
        warm = SamplingParams(temperature=first.temperature, ignore_eos=True, max_tokens=4)
        llm.generate([{"prompt_token_ids": first.prompt_token_ids[:16]}], warm, use_tqdm=False)
        llm.reset_prefix_cache()
    params = [
        SamplingParams(temperature=r.temperature, top_p=1.0, ignore_eos=r.ignore_eos, max_tokens=r.output_len)
        for r in requests
    ]
    prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in requests]
    spec_before = copy.deepcopy(llm.llm_engine.get_stats().spec_decoding_stats)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=True)
    elapsed = time.perf_counter() - start
    tokens = [list(output.outputs[0].token_ids) for output in outputs]
    for produced, request in zip(tokens, requests, strict=True):
        if request.ignore_eos and len(produced) != request.output_len:
            raise RuntimeError(f"a request produced {len(produced)} tokens, not {request.output_len}")
    runner = llm.llm_engine.engine_core.model_executor
    dtype = str(runner.dtype).removeprefix("torch.")
    result = ThroughputResult.measure("engine", model, dtype, requests, [len(t) for t in tokens], elapsed)
    tpots = [
        (o.timing.finished_time - o.timing.first_token_time) / (len(t) - 1) * 1000
        for o, t in zip(outputs, tokens, strict=True)
        if o.timing is not None and o.timing.first_token_time is not None and len(t) > 1
    ]
    if tpots:
        result.mean_tpot_ms, result.median_tpot_ms = statistics.fmean(tpots), statistics.median(tpots)
    rate, length, per_position = acceptance(spec_before, llm.llm_engine.get_stats().spec_decoding_stats)
    result.acceptance_rate, result.mean_acceptance_length = rate, length
    result.acceptance_rate_per_position = per_position if rate is not None else None
    if all(r.temperature == 0 for r in requests):
        result.greedy_output_sha256 = hashlib.sha256(json.dumps(tokens).encode()).hexdigest()
    per_kernel = measure_roofline_gflops(runner.arch, runner.dtype, runner.device)
    roofline = max(per_kernel.values())
    flop = model_flops(runner.arch, result.total_num_tokens, result.total_output_tokens)
    result.roofline_kernel = max(per_kernel, key=per_kernel.__getitem__)
    result.matmul_gflops = per_kernel
    result.roofline_gflops = roofline
    result.model_gflop = flop / 1e9
    result.achieved_gflops = flop / elapsed / 1e9
    result.roofline_fraction = result.achieved_gflops / roofline
    result.roofline_tokens_per_second = roofline * 1e9 / (flop / result.total_num_tokens)
    tp_stats = getattr(runner, "stats", None)
    if tp_stats is not None:
        result.tensor_parallel_size = tp_stats.tensor_parallel_size
        for name, value in tp_stats.per_step().items():
            setattr(result, f"tp_{name}", value)
        runner.shutdown()
    return result


def acceptance(before: Any, after: Any) -> tuple[float | None, float | None, list[float]]:
    """Acceptance rate, mean acceptance length and per-position rates between two SpecDecodingStats."""
    if after is None:
        return None, None, []
    drafts = after.num_drafts - before.num_drafts
    draft_tokens = after.num_draft_tokens - before.num_draft_tokens
    accepted = after.num_accepted_tokens - before.num_accepted_tokens
    if drafts == 0:
        return 0.0, 1.0, [0.0] * len(after.num_accepted_tokens_per_pos)
    per_pos = [(a - b) / drafts for a, b in zip(after.num_accepted_tokens_per_pos, before.num_accepted_tokens_per_pos,
                                                strict=True)]  # fmt: skip
    return accepted / draft_tokens, 1 + accepted / drafts, per_pos


def run_hf(model: str, requests: list[BenchRequest], dtype_name: str, batch_size: int) -> ThroughputResult:
    """transformers `generate` at its best: static batches sorted by length, inference mode, EOS ignored."""
    import torch
    from rich.progress import Progress
    from transformers import AutoModelForCausalLM

    from engine.model_files import load_hf_config, resolve_model
    from engine.model_runner import resolve_device, resolve_dtype
    from engine.models import ArchConfig

    path = resolve_model(model)
    device = resolve_device("auto")
    dtype = resolve_dtype(dtype_name, device, ArchConfig.from_hf(load_hf_config(path)).torch_dtype)
    hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    pad_id = hf_model.config.pad_token_id or 0
    ordered = sorted(requests, key=lambda r: (len(r.prompt_token_ids), r.output_len), reverse=True)
    batches = [ordered[i : i + batch_size] for i in range(0, len(ordered), batch_size)]
    start = time.perf_counter()
    with torch.inference_mode(), Progress(transient=True) as progress:
        task = progress.add_task("hf generate", total=len(requests))
        for batch in batches:
            longest = max(len(r.prompt_token_ids) for r in batch)
            ids = torch.full((len(batch), longest), pad_id, dtype=torch.long)
            mask = torch.zeros((len(batch), longest), dtype=torch.long)
            for row, r in enumerate(batch):  # left padding, as decoder-only generation needs
                ids[row, longest - len(r.prompt_token_ids) :] = torch.tensor(r.prompt_token_ids)
                mask[row, longest - len(r.prompt_token_ids) :] = 1
            new_tokens = max(r.output_len for r in batch)
            hf_model.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=batch[0].temperature > 0,
                temperature=batch[0].temperature or None,
                top_p=1.0,
                top_k=0,
                pad_token_id=pad_id,
            )
            progress.advance(task, len(batch))
    elapsed = time.perf_counter() - start
    output_lens = [r.output_len for r in requests]
    return ThroughputResult.measure("hf", model, str(dtype).removeprefix("torch."), requests, output_lens, elapsed)


def tensor_parallel_line(result: ThroughputResult) -> str:
    return (
        f"Tensor parallel: {result.tensor_parallel_size} ranks; per step {result.tp_step_ms:.1f} ms round trip, "
        f"{result.tp_execute_ms:.1f} ms forward on rank 0 of which {result.tp_collective_ms:.1f} ms in collectives; "
        f"{result.tp_step_payload_bytes:.0f} B step description to each rank, {result.tp_logits_bytes:.0f} B of "
        "logits back"
    )
