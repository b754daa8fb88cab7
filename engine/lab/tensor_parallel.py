"""`bench throughput-tp` (hidden; now `bench throughput --vary tensor_parallel_size=1,2`): the engine at several
tensor-parallel sizes, side by side.

Every size runs the same requests (random token-id prompts, EOS ignored) in a fresh engine, one after the other;
the table gives each size's throughput relative to the first size's and, for sizes above 1, the per-step cost of
tensor parallelism: the driver's round trip, rank 0's forward pass and its time in collectives (gloo on the CPU:
the whole exchange, waiting for the slowest rank included), and the bytes of the step description sent to each
rank and of the logits returned.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import typer

from engine.benchmarks.throughput import clean_errors, engine_logs
from engine.benchmarks.throughput_run import ThroughputResult, make_requests, run_engine, tensor_parallel_line
from engine.cli_options import knob_option, with_engine_knobs


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        sizes = []
    if not sizes or any(size < 1 for size in sizes):
        raise typer.BadParameter(f"--tensor-parallel-size takes comma-separated sizes >= 1, got {text!r}")
    return sizes


def comparison_table(results: list[ThroughputResult]) -> str:
    """A markdown table: one row per size, throughput relative to the first row."""
    base = results[0].tokens_per_second
    rows = [
        "| TP | elapsed s | total tok/s | output tok/s | vs first | step ms | forward ms | collectives ms "
        "| step payload B | logits B |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:

        def cell(value: float | None, digits: int = 1) -> str:
            return "—" if value is None else f"{value:.{digits}f}"

        rows.append(
            f"| {r.tensor_parallel_size} | {r.elapsed_time:.1f} | {r.tokens_per_second:.1f} | "
            f"{r.output_tokens_per_second:.1f} | {r.tokens_per_second / base:.2f}× | {cell(r.tp_step_ms)} | "
            f"{cell(r.tp_execute_ms)} | {cell(r.tp_collective_ms)} | {cell(r.tp_step_payload_bytes, 0)} | "
            f"{cell(r.tp_logits_bytes, 0)} |"
        )
    return "\n".join(rows)


@with_engine_knobs
def throughput_tp(
    engine_knobs: dict[str, Any],
    model: str = knob_option("model", "smollm2-135m", help="Model alias, HF dir, .gguf file or hub id."),
    tensor_parallel_size: str = knob_option("tensor_parallel_size", "1,2", help="Comma-separated sizes to compare."),
    num_prompts: int = typer.Option(16, help="Number of requests."),
    input_len: int = typer.Option(128, help="Prompt tokens per request (random ids)."),
    output_len: int = typer.Option(64, help="Output tokens per request, EOS ignored."),
    seed: int = knob_option("seed", 0, help="Seed of the prompts and of the engine."),
    output_json: Path | None = typer.Option(None, help="Write every size's result here as a JSON list."),
) -> None:
    """Offline engine throughput at each tensor-parallel size, with the communication cost per step."""
    sizes = parse_sizes(tensor_parallel_size)
    if num_prompts < 1 or input_len < 1 or output_len < 1:
        raise typer.BadParameter("--num-prompts, --input-len and --output-len must be >= 1")
    from engine.config import check_tensor_parallel_size
    from engine.model_files import load_hf_config, resolve_model
    from engine.models import ArchConfig
    from engine.tokenizer import get_tokenizer

    with clean_errors():
        arch = ArchConfig.from_hf(load_hf_config(resolve_model(model)))
        for size in sizes:  # every size is checked before the first one runs
            if size > 1:
                check_tensor_parallel_size(model, size)
    tokenizer = get_tokenizer(engine_knobs.get("tokenizer") or model)
    requests = make_requests(tokenizer, num_prompts, [(input_len, output_len)] * num_prompts, arch.vocab_size, seed)
    results = []
    for size in sizes:
        typer.echo(f"tensor_parallel_size={size}: {num_prompts} requests of {input_len} + {output_len} tokens")
        with clean_errors(), engine_logs():
            result = run_engine(model, requests, {**engine_knobs, "seed": seed, "tensor_parallel_size": size})
        if result.tp_step_ms is not None:
            typer.echo(tensor_parallel_line(result))
        results.append(result)
    typer.echo(comparison_table(results))
    if output_json is not None:
        output_json.parent.mkdir(parents=True, exist_ok=True)
        output_json.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
