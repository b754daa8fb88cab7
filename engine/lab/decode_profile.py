"""`bench lab decode-profile`: where one stream's per-token decode time goes, in this engine and in llama.cpp.

Both run in this process on the same prompt token ids (`input_len` of them, then `output_len` greedy tokens, EOS
ignored), so what is left of a server's TPOT over these figures is its HTTP/streaming path (compare with
`bench compare`).

* This engine (`LLMEngine.step`, one request): each decode step's wall time split into the scheduler
  (`schedule` and `update_from_output`), the model forward (`execute_model`), the sampler, the rest of
  `EngineCore.step` and the output processing/detokenizer (`LLMEngine.step` less `EngineCore.step`); then a
  second run under torch.profiler gives the forward's top operators by self CPU time per token.
* llama.cpp (`llama_cpp.Llama`, the same GGUF): `eval` of one token (its whole forward) and the greedy pick
  (argmax over its logits) per token.

The prefill step is left out of every figure; each is a per-token median (operators: total / decode steps).
"""

from __future__ import annotations

import json
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

PARTS = ("schedule", "execute_model", "sampler", "update_from_output")


def prompt_ids(input_len: int) -> list[int]:
    return [(17 * i) % 4000 + 100 for i in range(input_len)]


class _Timed:
    """Wraps a callable; appends each call's wall time (s) to `times`."""

    def __init__(self, fn: Callable[..., Any], times: list[float]) -> None:
        self.fn, self.times = fn, times

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.times.append(time.perf_counter() - start)


def _generate(engine: Any, input_len: int, output_len: int, step: Callable[[], Any]) -> None:
    from engine.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=output_len, ignore_eos=True, temperature=0.0)
    engine.add_request("profile", prompt_ids(input_len), params)
    while engine.has_unfinished_requests():
        step()


def profile_engine(knobs: dict[str, Any], input_len: int, output_len: int, top_ops: int = 10) -> dict[str, Any]:
    """Per-token decode time (ms) of each part of this engine's step, and the forward's top operators."""
    import torch

    from engine.llm import LLM

    llm = LLM(**knobs, max_model_len=input_len + output_len, max_num_seqs=1,
              max_num_batched_tokens=max(input_len, 64))  # fmt: skip  # the prefill is one step
    engine = llm.llm_engine
    core = engine.engine_core
    _generate(engine, input_len, output_len, engine.step)  # warm-up
    times: dict[str, list[float]] = defaultdict(list)
    core.scheduler.schedule = _Timed(core.scheduler.schedule, times["schedule"])
    core.scheduler.update_from_output = _Timed(core.scheduler.update_from_output, times["update_from_output"])
    core.model_executor.execute_model = _Timed(core.model_executor.execute_model, times["execute_model"])
    core.sampler = _Timed(core.sampler, times["sampler"])
    core.step = _Timed(core.step, times["core_step"])
    _generate(engine, input_len, output_len, _Timed(engine.step, times["engine_step"]))
    decode = {name: values[1:] for name, values in times.items()}  # the first step is the prefill
    ms = {name: 1000 * statistics.median(values) for name, values in decode.items()}
    parts = {name: ms[name] for name in PARTS}
    parts["rest of EngineCore.step"] = ms["core_step"] - sum(ms[name] for name in PARTS)
    parts["output processing + detokenizer"] = ms["engine_step"] - ms["core_step"]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        _generate(engine, input_len, output_len, engine.step)
    steps = output_len - 1
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:top_ops]
    operators = {e.key: e.self_cpu_time_total / 1000 / steps for e in ops}  # us -> ms, per decode step (approx.)
    del llm
    return {"parts_ms": parts, "step_ms": ms["engine_step"], "top_operators_ms_per_token": operators,
            "note": "operators include the prefill step's share (total / decode steps)"}


def profile_llama_cpp(gguf: Path, input_len: int, output_len: int, threads: int) -> dict[str, Any]:
    """Per-token decode time (ms) of llama.cpp's forward (`eval` of one token) and its greedy pick."""
    import numpy as np
    from llama_cpp import Llama

    n_ctx = input_len + output_len + 8
    llm = Llama(str(gguf), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, n_batch=n_ctx,
                verbose=False)  # fmt: skip  # n_batch = n_ctx: `scores` holds a row per position
    evals: list[float] = []
    picks: list[float] = []
    for attempt in range(2):  # the first run warms up
        llm.reset()
        llm.eval(prompt_ids(input_len))
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        for _ in range(output_len - 1):
            start = time.perf_counter()
            llm.eval([token])
            evaluated = time.perf_counter()
            token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            if attempt:
                evals.append(evaluated - start)
                picks.append(time.perf_counter() - evaluated)
    del llm
    return {"parts_ms": {"eval (forward)": 1000 * statistics.median(evals),
                         "greedy pick (argmax)": 1000 * statistics.median(picks)}}  # fmt: skip


def decode_profile(
    model: str = typer.Option("smollm2-135m", help="This engine's model (llama.cpp loads the default model's GGUF)."),
    settings: str = typer.Option("none,int4", help="Comma-separated --quantization settings of this engine."),
    input_len: int = typer.Option(256, help="Prompt tokens."),
    output_len: int = typer.Option(128, help="Output tokens (EOS ignored)."),
    threads: int | None = typer.Option(None, help="Threads for both [default: torch's for ours, 2 for llama.cpp]."),
    llama_cpp: bool = typer.Option(True, "--llama-cpp/--no-llama-cpp", help="Also profile llama.cpp (same GGUF)."),
    output_json: Path | None = typer.Option(None, help="Write the profile here as JSON."),
) -> None:
    """Per-token decode time by part (scheduler, forward, sampler, detokenizer; top operators) against llama.cpp."""
    import torch

    from engine.benchmarks.throughput import clean_errors
    from engine.model_files import smollm2_gguf_path

    if input_len < 1 or output_len < 3:
        raise typer.BadParameter("--input-len must be >= 1, --output-len >= 3")
    if llama_cpp and model != "smollm2-135m":
        raise typer.BadParameter("--llama-cpp loads the default model's GGUF: use --no-llama-cpp with --model")
    previous_threads = torch.get_num_threads()
    result: dict[str, Any] = {"input_len": input_len, "output_len": output_len, "threads": threads}
    try:
        with clean_errors():
            for quantization in [s.strip() for s in settings.split(",")]:
                knobs = {"model": model, "quantization": quantization, "cpu_threads": threads}
                result[f"ours/{quantization}"] = profile_engine(knobs, input_len, output_len)
    finally:
        torch.set_num_threads(previous_threads)
    if llama_cpp:
        result["llama.cpp"] = profile_llama_cpp(smollm2_gguf_path(), input_len, output_len, threads or 2)
    for name, record in result.items():
        if not isinstance(record, dict):
            continue
        total = sum(record["parts_ms"].values())
        typer.echo(f"{name}: {total:.2f} ms/token")
        for part, value in record["parts_ms"].items():
            typer.echo(f"  {part:<34} {value:8.3f} ms  ({100 * value / total:5.1f} %)")
        for op, value in record.get("top_operators_ms_per_token", {}).items():
            typer.echo(f"    op {op:<40} {value:8.3f} ms")
    if output_json is not None:
        output_json.parent.mkdir(parents=True, exist_ok=True)
        output_json.write_text(json.dumps(result, indent=2) + "\n")
