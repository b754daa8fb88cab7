"""`bench throughput`: offline throughput like vLLM's, for our engine or HF transformers `generate`.

Both backends get the same prompts: random token ids of exactly input_len tokens (special tokens
excluded), and each request produces exactly output_len tokens (EOS ignored). vLLM's definitions:
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
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import typer

from engine.cli_options import knob_option, with_engine_knobs


@dataclass
class BenchRequest:
    prompt_token_ids: list[int]
    output_len: int


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

    @classmethod
    def measure(cls, backend: str, model: str, dtype: str, requests: list[BenchRequest], elapsed: float) -> Any:
        prompt = sum(len(r.prompt_token_ids) for r in requests)
        output = sum(r.output_len for r in requests)
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
    tokenizer: Any, num_prompts: int, lengths: list[tuple[int, int]], vocab_size: int, seed: int
) -> list[BenchRequest]:
    import numpy as np

    special = set(tokenizer.all_special_ids)
    candidates = np.array([t for t in range(min(len(tokenizer), vocab_size)) if t not in special])
    rng = np.random.default_rng(seed)
    return [
        BenchRequest(rng.choice(candidates, size=input_len).tolist(), output_len)
        for input_len, output_len in lengths[:num_prompts]
    ]


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


def run_engine(model: str, requests: list[BenchRequest], knobs: dict[str, Any]) -> ThroughputResult:
    from engine import LLM, SamplingParams

    llm = LLM(model, **knobs)
    params = [SamplingParams(temperature=1.0, top_p=1.0, ignore_eos=True, max_tokens=r.output_len) for r in requests]
    prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in requests]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=True)
    elapsed = time.perf_counter() - start
    for output, request in zip(outputs, requests, strict=True):
        produced = len(output.outputs[0].token_ids)
        if produced != request.output_len:
            raise RuntimeError(f"a request produced {produced} tokens, not {request.output_len}")
    runner = llm.llm_engine.engine_core.model_executor
    result = ThroughputResult.measure("engine", model, str(runner.dtype).removeprefix("torch."), requests, elapsed)
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
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                pad_token_id=pad_id,
            )
            progress.advance(task, len(batch))
    elapsed = time.perf_counter() - start
    return ThroughputResult.measure("hf", model, str(dtype).removeprefix("torch."), requests, elapsed)


# workloads.load's shape: (workload, num_requests=, seed=, input_len=, output_len=, max_model_len=) -> specs with
# input_len and output_len. The engine imports no workloads code: cli.py hands the loader in.
WorkloadLoader = Callable[..., Sequence[Any]]


@with_engine_knobs
def throughput(
    ctx: typer.Context,
    engine_knobs: dict[str, Any],
    backend: str = typer.Option("engine", help="engine | hf (transformers generate, static batches)"),
    model: str = knob_option("model", "smollm2-135m", help="Model alias, HF dir, .gguf file or hub id."),
    num_prompts: int = typer.Option(32, help="Number of requests."),
    input_len: int | None = typer.Option(None, help="Prompt tokens per request (random ids) [default: 256]."),
    output_len: int | None = typer.Option(None, help="Output tokens per request, EOS ignored [default: 128]."),
    workload: str | None = typer.Option(
        None, help="Take lengths from a workload (`bench workloads list`); generators also take the lengths."
    ),
    seed: int = knob_option("seed", 0, help="Seed of the prompts and of the engine."),
    output_json: Path | None = typer.Option(None, help="Write the results here as JSON."),
    hf_batch_size: int = typer.Option(32, help="Static batch size of --backend hf."),
) -> None:
    """Offline throughput of the engine or of HF transformers, vLLM `bench throughput` style.

    --backend hf uses --dtype (and --tokenizer, --max-model-len for the prompts); the other engine knobs are the
    engine's only.
    """
    if backend not in ("engine", "hf"):
        raise typer.BadParameter(f"--backend must be engine or hf, got {backend!r}")
    if num_prompts < 1 or hf_batch_size < 1:
        raise typer.BadParameter("--num-prompts and --hf-batch-size must be >= 1")
    from engine.model_files import load_hf_config, resolve_model
    from engine.models import ArchConfig
    from engine.tokenizer import get_tokenizer

    with _clean_errors():
        arch = ArchConfig.from_hf(load_hf_config(resolve_model(model)))
    if workload is None:
        lengths = [(input_len or 256, output_len or 128)] * num_prompts
    else:
        load_workload: WorkloadLoader | None = ctx.obj
        if load_workload is None:
            raise typer.BadParameter("--workload needs the workloads package, which this `bench` was built without")
        try:  # generators take --input-len/--output-len; shipped mixes refuse them with a clear message
            specs = load_workload(
                workload, num_requests=num_prompts, seed=seed, input_len=input_len, output_len=output_len,
                max_model_len=engine_knobs.get("max_model_len") or arch.max_model_len,
            )  # fmt: skip
        except ValueError as error:
            raise typer.BadParameter(str(error)) from error
        lengths = [(s.input_len, s.output_len) for s in specs]
    if any(i < 1 or o < 1 for i, o in lengths):
        raise typer.BadParameter("every request needs input and output lengths >= 1")

    tokenizer = get_tokenizer(engine_knobs.get("tokenizer") or model)
    requests = make_requests(tokenizer, num_prompts, lengths, arch.vocab_size, seed)
    if backend == "engine":
        with _clean_errors(), _engine_logs():
            result = run_engine(model, requests, {**engine_knobs, "seed": seed})
    else:
        result = run_hf(model, requests, engine_knobs.get("dtype", "auto"), hf_batch_size)
    typer.echo(
        f"Throughput: {result.requests_per_second:.2f} requests/s, {result.tokens_per_second:.2f} total tokens/s, "
        f"{result.output_tokens_per_second:.2f} output tokens/s ({result.num_requests} requests, "
        f"{result.total_num_tokens} tokens, {result.elapsed_time:.2f} s, {result.backend}, {result.dtype})"
    )
    if result.roofline_fraction is not None:
        typer.echo(
            f"Roofline: {result.achieved_gflops:.1f} of {result.roofline_gflops:.1f} GFLOP/s = "
            f"{100 * result.roofline_fraction:.1f} % (roofline ~ {result.roofline_tokens_per_second:.0f} total tok/s; "
            + ", ".join(f"{k} {v:.1f} GFLOP/s" for k, v in (result.matmul_gflops or {}).items())
            + ")"
        )
    if result.tp_step_ms is not None:
        typer.echo(tensor_parallel_line(result))
    if output_json is not None:
        output_json.parent.mkdir(parents=True, exist_ok=True)
        output_json.write_text(json.dumps(asdict(result), indent=2) + "\n")


def tensor_parallel_line(result: ThroughputResult) -> str:
    return (
        f"Tensor parallel: {result.tensor_parallel_size} ranks; per step {result.tp_step_ms:.1f} ms round trip, "
        f"{result.tp_execute_ms:.1f} ms forward on rank 0 of which {result.tp_collective_ms:.1f} ms in collectives; "
        f"{result.tp_step_payload_bytes:.0f} B step description to each rank, {result.tp_logits_bytes:.0f} B of "
        "logits back"
    )


def prepare_model(
    model: str = typer.Argument("smollm2-135m", help="Model alias, HF dir, .gguf file or hub id."),
) -> None:
    """Resolve a model, convert/cache its weights and tokenizer, and print where they are."""
    from engine.model_files import resolve_model
    from engine.tokenizer import get_tokenizer

    with _clean_errors():
        path = resolve_model(model)
        get_tokenizer(str(path) if model not in ("smollm2-135m", "tiny-random") else model)
    typer.echo(str(path))


@contextmanager
def _engine_logs() -> Iterator[None]:
    """Show the engine's INFO lines (how many KV blocks and tokens fit) on stderr while the command runs."""
    logger = logging.getLogger("engine")
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    previous_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous_level)


@contextmanager
def _clean_errors() -> Iterator[None]:
    """Bad input (a missing model, an impossible knob) ends the command with its message, not a traceback."""
    from engine.config import ConfigError
    from engine.model_files import ModelNotFoundError

    try:
        yield
    except (ModelNotFoundError, ConfigError, ValueError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from error
