"""`bench decode-speed` (hidden; now `bench throughput --vary dtype=... --vary quantization=... --num-prompts 3
--max-num-seqs 1 --temperature 0`, whose median TPOT is the batch-1 decode time): batch-1 decode speed of several
dtype/quantization settings, side by side in one run.

Each setting gets its own engine (loaded in turn, in this process) and generates `output_len` tokens (EOS
ignored) after the same `input_len`-token prompt, `repeats` times after one warm-up. Decode speed is
(output tokens - 1) / (finished - first token) on the engine clock, so prefill is left out; the table shows the
median over the repeats and the ratio to the first setting. `--threads 1` keeps the comparison steadier on a
machine other jobs share (two OpenMP threads stall whenever either is descheduled).
"""

from __future__ import annotations

import gc
import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import typer

DEFAULT_SETTINGS = "float32/none,bfloat16/none,float32/int8,float32/int4"


@dataclass
class DecodeSpeed:
    dtype: str
    quantization: str
    output_tokens_per_second: float  # median over the repeats, batch 1, decode only
    ratio: float  # to the first setting


def parse_settings(text: str) -> list[tuple[str, str]]:
    """'float32/none,float32/int8' -> [('float32', 'none'), ('float32', 'int8')]."""
    settings = []
    for item in text.split(","):
        dtype, sep, quantization = item.strip().partition("/")
        if not sep or not dtype or not quantization:
            raise typer.BadParameter(f"each setting is DTYPE/QUANTIZATION (e.g. float32/int8), got {item!r}")
        settings.append((dtype, quantization))
    return settings


def measure_decode_speed(
    model: str, dtype: str, quantization: str, input_len: int, output_len: int, repeats: int,
    cpu_threads: int | None = None,
) -> float:  # fmt: skip
    from engine.llm import LLM
    from engine.sampling_params import SamplingParams

    llm = LLM(
        model, dtype=dtype, quantization=quantization, max_model_len=input_len + output_len, max_num_seqs=1,
        cpu_threads=cpu_threads,
    )  # fmt: skip
    prompt = {"prompt_token_ids": [(17 * i) % 4000 + 100 for i in range(input_len)]}
    params = SamplingParams(max_tokens=output_len, ignore_eos=True, temperature=0.0)
    speeds = []
    for attempt in range(repeats + 1):
        (output,) = llm.generate(prompt, params, use_tqdm=False)
        timing = output.timing
        assert timing is not None and timing.first_token_time is not None and timing.finished_time is not None
        if attempt:  # the first run warms up
            speeds.append((output_len - 1) / (timing.finished_time - timing.first_token_time))
        llm.reset_prefix_cache()
    del llm
    gc.collect()
    return statistics.median(speeds)


def decode_speed(
    model: str = typer.Option("smollm2-135m", help="Model alias, HF dir, .gguf file or hub id."),
    settings: str = typer.Option(DEFAULT_SETTINGS, help="Comma-separated DTYPE/QUANTIZATION settings to compare."),
    input_len: int = typer.Option(32, help="Prompt tokens."),
    output_len: int = typer.Option(64, help="Output tokens per run (EOS ignored)."),
    repeats: int = typer.Option(3, help="Timed runs per setting, after one warm-up."),
    threads: int | None = typer.Option(None, help="The engines' --cpu-threads [default: torch's]."),
    output_json: Path | None = typer.Option(None, help="Write the results here as JSON."),
) -> None:
    """Batch-1 decode output tok/s of each setting, with its ratio to the first one."""
    if input_len < 1 or output_len < 2 or repeats < 1:
        raise typer.BadParameter("--input-len and --repeats must be >= 1, --output-len >= 2")
    from engine.benchmarks.throughput import clean_errors

    if threads is not None and threads < 1:
        raise typer.BadParameter("--threads must be >= 1")
    import torch

    previous_threads = torch.get_num_threads()
    results: list[DecodeSpeed] = []
    try:  # the in-process engine sets this process's torch threads: put them back afterwards
        with clean_errors():
            for dtype, quantization in parse_settings(settings):
                speed = measure_decode_speed(model, dtype, quantization, input_len, output_len, repeats, threads)
                ratio = speed / results[0].output_tokens_per_second if results else 1.0
                results.append(DecodeSpeed(dtype, quantization, speed, ratio))
                typer.echo(f"{dtype:>9} {quantization:>5}: {speed:8.1f} output tok/s  ({ratio:.2f}x)")
    finally:
        torch.set_num_threads(previous_threads)
    if output_json is not None:
        output_json.parent.mkdir(parents=True, exist_ok=True)
        output_json.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
