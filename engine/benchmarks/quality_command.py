"""`bench check quality`: the command over engine/benchmarks/quality.py's measurement."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import typer

from engine.benchmarks.quality import TEXT_PATH, measure_quality
from engine.cli_options import knob_option, with_engine_knobs


@with_engine_knobs
def quality(
    engine_knobs: dict[str, Any],
    model: str = knob_option("model", "smollm2-135m", help="Model alias, HF dir, .gguf file or hub id."),
    window: int = typer.Option(1024, help="Tokens per scored window (each window is one prompt)."),
    num_tokens: int | None = typer.Option(None, help="Score only the text's first N tokens [default: all]."),
    output_json: Path | None = typer.Option(None, help="Write the result here as JSON."),
) -> None:
    """Perplexity on a shipped public-domain text and top-1 agreement with the reference.

    Both are teacher-forced through prompt_logprobs; the reference is the same configuration with
    --quantization none and --kv-cache-dtype auto.
    """
    from engine.benchmarks.throughput import clean_errors, engine_logs

    with clean_errors(), engine_logs():
        result = measure_quality({**engine_knobs, "model": model}, window=window, num_tokens=num_tokens)
    typer.echo(
        f"Quality ({result.model}, quantization={result.quantization}, kv_cache_dtype={result.kv_cache_dtype}, "
        f"dtype={result.dtype}; "
        f"{result.num_scored_tokens} tokens of {TEXT_PATH.name}):\n"
        f"  perplexity {result.perplexity:.4f} vs reference {result.reference_perplexity:.4f} "
        f"({100 * result.perplexity_increase:+.2f} %)\n"
        f"  top-1 agreement with reference: {100 * result.top1_agreement:.2f} %"
    )
    if output_json is not None:
        output_json.parent.mkdir(parents=True, exist_ok=True)
        output_json.write_text(json.dumps(asdict(result), indent=2) + "\n")
