"""`bench lab structured-outputs`: what grammar-constrained decoding costs, measured side by side in one run.

* compile: a small (4-field) and a large (64-field, nested) JSON schema, compiled cold
  (xgrammar's compile for the model's tokenizer, median of `--repeats`) and cached (the engine's cache lookup);
* mask: per step, filling the bitmask rows of a batch of 1 and 32 constrained requests (the manager's
  `fill_bitmask`, matchers part-way through a valid output) and applying them to the logits (the sampler's
  `apply_token_bitmask`);
* TPOT: mean per-request TPOT ((finished - first token) / (output tokens - 1), engine clock) of the offline engine
  at 1 and at `--concurrency` requests in flight, unconstrained (EOS ignored, `--output-len` tokens) and under a
  JSON schema (the small one: outputs end where the grammar does, at most `--output-len` tokens).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer


@dataclass
class MaskTiming:
    batch_size: int
    fill_ms: float  # per step, all rows
    apply_ms: float

    @property
    def total_ms(self) -> float:
        return self.fill_ms + self.apply_ms


def json_schema(num_fields: int, depth: int = 0) -> dict:
    """An object schema of `num_fields` required properties cycling through bounded integers, booleans, enums,
    bounded strings, arrays of enums and (two levels deep at most) nested objects of 4 fields."""
    properties: dict[str, dict] = {}
    for index in range(num_fields):
        kind = index % (6 if depth < 2 else 5)
        properties[f"field_{index}"] = [
            {"type": "integer", "minimum": 0, "maximum": 1000},
            {"type": "boolean"},
            {"enum": [f"option_{k}" for k in range(4)]},
            {"type": "string", "maxLength": 16},
            {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
            {},
        ][kind] or json_schema(4, depth + 1)
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


def compile_times(backend: Any, schemas: dict[str, dict], repeats: int) -> dict[str, dict[str, float]]:
    """Per schema: cold compile ms (median) and the cached lookup ms (median), through the engine's manager."""
    from engine.request import Request
    from engine.sampling_params import SamplingParams
    from engine.structured_output import StructuredOutputsParams
    from engine.structured_output.manager import StructuredOutputManager

    out = {}
    for name, schema in schemas.items():
        params = StructuredOutputsParams(json=schema)
        cold = []
        for _ in range(repeats):
            start = time.perf_counter()
            backend.compile(params)
            cold.append((time.perf_counter() - start) * 1000)
        manager = StructuredOutputManager(lambda: backend, backend.vocab_size)
        sampling = SamplingParams(structured_outputs=params)
        first = Request("warm", [1], sampling)
        manager.add_request(first)
        manager._states["warm"].future.result()
        cached = []
        for i in range(repeats):
            request = Request(f"r{i}", [1], sampling)
            start = time.perf_counter()
            manager.add_request(request)
            ready = manager.grammar_ready(request)
            cached.append((time.perf_counter() - start) * 1000)
            assert ready
        manager.shutdown()
        out[name] = {"cold_ms": statistics.median(cold), "cached_ms": statistics.median(cached)}
    return out


def mask_times(backend: Any, tokenizer: Any, schema: dict, batch_sizes: list[int], steps: int) -> list[MaskTiming]:
    """Mean per-step fill and apply time; row i of the batch is `i` tokens into a valid output of `schema`."""
    import torch

    from engine.request import Request
    from engine.sampler import apply_token_bitmask
    from engine.sampling_params import SamplingParams
    from engine.scheduler_output import LogitsRows, ScheduledRequest
    from engine.structured_output import StructuredOutputsParams
    from engine.structured_output.manager import StructuredOutputManager

    params = StructuredOutputsParams(json=schema)
    text = json.dumps(_instance(schema))
    tokens = tokenizer.encode(text, add_special_tokens=False)
    results = []
    for batch_size in batch_sizes:
        manager = StructuredOutputManager(lambda: backend, backend.vocab_size)
        requests = [Request(f"b{i}", [1], SamplingParams(structured_outputs=params)) for i in range(batch_size)]
        for request in requests:
            manager.add_request(request)
            assert manager._states[request.request_id].future.result() and manager.grammar_ready(request)
        logits = torch.randn(batch_size, backend.vocab_size)
        fill = apply = 0.0
        for step in range(steps):
            for i, request in enumerate(requests):
                position = (i + step) % max(len(tokens) - 1, 1)
                if request.num_output_tokens > position:  # wrapped around: start the output again
                    manager.rebuild([request.request_id])
                request.output_token_ids = tokens[:position]
            scheduled = [ScheduledRequest(r, 1, [], sample=True) for r in requests]
            layout = LogitsRows.of(scheduled)
            manager.advance(scheduled)  # the matchers consume the step's token (not timed: that is not the mask)
            start = time.perf_counter()
            result = manager.fill_bitmask(scheduled, layout)
            fill += time.perf_counter() - start
            assert result is not None
            bitmask, rows = result
            row_logits = logits.clone()
            start = time.perf_counter()
            apply_token_bitmask(row_logits, bitmask, rows)
            apply += time.perf_counter() - start
        manager.shutdown()
        results.append(MaskTiming(batch_size, fill / steps * 1000, apply / steps * 1000))
    return results


def _instance(schema: dict) -> Any:
    """A valid instance of a workload schema."""
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "object":
        return {name: _instance(child) for name, child in schema["properties"].items()}
    if kind == "array":
        return [_instance(schema["items"]), _instance(schema["items"])]
    return {"string": "text", "integer": 42, "boolean": True}.get(kind)


def tpot_ms(llm: Any, schema: dict | None, concurrency: int, output_len: int) -> tuple[float, float]:
    """(mean TPOT ms, mean output tokens) of `concurrency` requests run together."""
    from engine.sampling_params import SamplingParams
    from engine.structured_output import StructuredOutputsParams

    tokenizer = llm.get_tokenizer()
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Describe an item as JSON."}], tokenize=False, add_generation_prompt=True
    )
    so = StructuredOutputsParams(json=schema) if schema is not None else None
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=so is None, structured_outputs=so)
    outputs = llm.generate([prompt] * concurrency, params, use_tqdm=False)
    tpots, lengths = [], []
    for output in outputs:
        timing, n = output.timing, len(output.outputs[0].token_ids)
        lengths.append(n)
        if n > 1:
            tpots.append((timing.finished_time - timing.first_token_time) / (n - 1) * 1000)
    return statistics.mean(tpots), statistics.mean(lengths)


def structured_outputs_bench(
    model: str = typer.Option("smollm2-135m", help="Model (its tokenizer's vocabulary sizes the masks)."),
    concurrency: int = typer.Option(16, help="Requests in flight for the second TPOT point (the first is 1)."),
    output_len: int = typer.Option(48, help="Output tokens per unconstrained request; the constrained ones' cap."),
    mask_steps: int = typer.Option(200, help="Steps averaged per mask-time batch size."),
    repeats: int = typer.Option(5, help="Cold compiles (and cache lookups) per schema; the median is reported."),
    output_json: Path | None = typer.Option(None, help="Also write the figures as JSON."),
) -> None:
    """Grammar compile time (cold, cached), per-step mask time (batch 1, 32) and TPOT with and without a JSON
    schema, measured side by side."""
    from engine.llm import LLM
    from engine.structured_output.backend_xgrammar import XgrammarBackend

    llm = LLM(model, max_model_len=512, max_num_seqs=max(concurrency, 1))
    engine = llm.llm_engine.engine_core
    tokenizer = llm.get_tokenizer()
    backend = XgrammarBackend(tokenizer, engine.vocab_size, engine.eos_token_ids)
    schemas = {"small": json_schema(4), "large": json_schema(64)}
    typer.echo(f"model {model}: vocabulary {engine.vocab_size}; compiling …", err=True)
    figures: dict[str, Any] = {"model": model, "compile": compile_times(backend, schemas, repeats)}
    typer.echo("mask time …", err=True)
    figures["mask"] = [vars(m) | {"total_ms": m.total_ms} for m in mask_times(backend, tokenizer, schemas["small"],
                                                                             [1, 32], mask_steps)]  # fmt: skip
    small = schemas["small"]
    figures["tpot"] = []
    for batch in (1, concurrency):
        typer.echo(f"TPOT at {batch} in flight …", err=True)
        free, free_len = tpot_ms(llm, None, batch, output_len)
        constrained, constrained_len = tpot_ms(llm, small, batch, output_len)
        figures["tpot"].append({"concurrency": batch, "unconstrained_ms": free, "json_schema_ms": constrained,
                                "ratio": constrained / free, "unconstrained_tokens": free_len,
                                "json_schema_tokens": constrained_len})  # fmt: skip
    _print(figures)
    if output_json is not None:
        output_json.write_text(json.dumps(figures, indent=2) + "\n")


def _print(figures: dict[str, Any]) -> None:
    typer.echo("| schema | cold compile ms | cached ms |\n|---|---:|---:|")
    for name, row in figures["compile"].items():
        typer.echo(f"| {name} | {row['cold_ms']:.2f} | {row['cached_ms']:.4f} |")
    typer.echo("\n| batch | fill ms/step | apply ms/step | total ms/step |\n|---:|---:|---:|---:|")
    for row in figures["mask"]:
        typer.echo(f"| {row['batch_size']} | {row['fill_ms']:.3f} | {row['apply_ms']:.3f} | {row['total_ms']:.3f} |")
    typer.echo("\n| in flight | TPOT unconstrained ms | TPOT JSON schema ms | ratio |\n|---:|---:|---:|---:|")
    for row in figures["tpot"]:
        typer.echo(f"| {row['concurrency']} | {row['unconstrained_ms']:.1f} | {row['json_schema_ms']:.1f} | "
                   f"{row['ratio']:.3f} |")  # fmt: skip
