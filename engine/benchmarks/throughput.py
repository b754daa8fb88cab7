"""`bench throughput` (offline throughput, vLLM style, with `--vary` for side-by-side engines) and
`bench model prepare`. The measurement is engine/benchmarks/throughput_run.py; `--vary` is vary.py."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import typer

from engine.benchmarks.throughput_run import (
    BenchRequest,
    ThroughputResult,
    WorkloadLoaders,
    chat_prompt_ids,
    make_requests,
    run_engine,
    run_hf,
    tensor_parallel_line,
)
from engine.cli_options import knob_option, with_engine_knobs

VARY_HELP = (
    "KNOB=V1,V2,...: one engine per value (an engine knob by its config field name: dtype, quantization, "
    "kv_cache_dtype, tensor_parallel_size, max_num_seqs, cpu_threads, ...; `default` = the engine's default), the "
    "same requests, then a table of output tok/s against the first combination (and, with 2+ --vary, against the "
    "first value of the first --vary, the rest alike). Repeat for a grid (the first --vary outermost). "
    "num_speculative_tokens=0,2,4 varies speculation: 0 off, K n-gram with K tokens (or --speculative-config with its "
    "num_speculative_tokens set to K); knobs whose values hold commas (speculative_config, "
    "structured_outputs_config, quantization_skip) are not varied. Each engine serves one untimed warm-up request "
    "first; with --temperature 0 the table says whether each point's tokens are the first's."
)


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
        None,
        help="Take lengths from a workload (`bench workloads list`; generators also take the lengths), or the "
        "prompts of a text workload (copy-heavy: chat prompts ending at EOS or --output-len; engine backend).",
    ),
    temperature: float = typer.Option(1.0, help="Sampling temperature of every request (0: greedy)."),
    vary: list[str] | None = typer.Option(None, "--vary", help=VARY_HELP),
    seed: int = knob_option("seed", 0, help="Seed of the prompts and of the engine."),
    output_json: Path | None = typer.Option(None, help="Write the results here as JSON (with --vary: every point)."),
    hf_batch_size: int = typer.Option(32, help="Static batch size of --backend hf."),
) -> None:
    """Offline throughput of the engine or of HF transformers, vLLM `bench throughput` style.

    --backend hf uses --dtype (and --tokenizer, --max-model-len for the prompts); the other engine knobs are the
    engine's only. With --vary, one engine per combination runs the same requests in turn, side by side.
    """
    if backend not in ("engine", "hf"):
        raise typer.BadParameter(f"--backend must be engine or hf, got {backend!r}")
    if num_prompts < 1 or hf_batch_size < 1:
        raise typer.BadParameter("--num-prompts and --hf-batch-size must be >= 1")
    if temperature < 0:
        raise typer.BadParameter(f"--temperature must be >= 0, got {temperature}")
    from engine.benchmarks import vary as varying

    try:
        varies = varying.parse_varies(vary or [], engine_knobs)
    except varying.VaryError as error:
        raise typer.BadParameter(str(error)) from error
    if varies and backend != "engine":
        raise typer.BadParameter("--vary runs the engine backend only")
    from engine.config import EngineConfig
    from engine.model_files import load_hf_config, resolve_model
    from engine.models import ArchConfig

    base = {**engine_knobs, "seed": seed}
    with clean_errors():
        arch = ArchConfig.from_hf(load_hf_config(resolve_model(model)))
        for combination in varying.expand_grid(varies):  # every point's configuration, before any engine loads
            EngineConfig.from_kwargs(model=model, **varying.point_knobs(base, combination))
    requests = _requests(ctx.obj, backend, model, arch, engine_knobs, num_prompts, input_len, output_len, workload,
                         seed, temperature)  # fmt: skip
    if varies:
        return _run_vary(varies, base, model, requests, output_json)
    if backend == "engine":
        with clean_errors(), engine_logs():
            result = run_engine(model, requests, base)
    else:
        result = run_hf(model, requests, engine_knobs.get("dtype", "auto"), hf_batch_size)
    _echo_result(result)
    if output_json is not None:
        output_json.parent.mkdir(parents=True, exist_ok=True)
        output_json.write_text(json.dumps(asdict(result), indent=2) + "\n")


def _requests(
    loaders: WorkloadLoaders | None, backend: str, model: str, arch: Any, engine_knobs: dict[str, Any],
    num_prompts: int, input_len: int | None, output_len: int | None, workload: str | None, seed: int,
    temperature: float,
) -> list[BenchRequest]:  # fmt: skip
    """The run's requests: fixed lengths, a workload's lengths (random-id prompts, EOS ignored) or its texts."""
    from engine.tokenizer import get_tokenizer

    tokenizer = get_tokenizer(engine_knobs.get("tokenizer") or model)
    if workload is None:
        lengths = [(input_len or 256, output_len or 128)] * num_prompts
    else:
        if loaders is None:
            raise typer.BadParameter("--workload needs the workloads package, which this `bench` was built without")
        try:
            texts = loaders.texts(workload, num_requests=num_prompts, seed=seed, output_len=output_len or 128)
        except ValueError:  # not a text workload
            texts = None
        if texts is not None:
            if backend != "engine" or input_len is not None:
                raise typer.BadParameter(f"text workload {workload!r}: engine backend only, and no --input-len")
            return [BenchRequest(chat_prompt_ids(tokenizer, t.prompt), t.output_len, ignore_eos=False,
                                 temperature=temperature) for t in texts]  # fmt: skip
        try:  # generators take --input-len/--output-len; shipped mixes refuse them with a clear message
            specs = loaders.lengths(
                workload, num_requests=num_prompts, seed=seed, input_len=input_len, output_len=output_len,
                max_model_len=engine_knobs.get("max_model_len") or arch.max_model_len,
            )  # fmt: skip
        except ValueError as error:
            raise typer.BadParameter(str(error)) from error
        lengths = [(s.input_len, s.output_len) for s in specs]
    if any(i < 1 or o < 1 for i, o in lengths):
        raise typer.BadParameter("every request needs input and output lengths >= 1")
    return make_requests(tokenizer, num_prompts, lengths, arch.vocab_size, seed, temperature)


def _run_vary(varies: list[Any], base: dict[str, Any], model: str, requests: list[BenchRequest],
              output_json: Path | None) -> None:  # fmt: skip
    from engine.benchmarks import vary as varying

    def run(combination: dict[str, Any], knobs: dict[str, Any]) -> ThroughputResult:
        typer.echo(f"{varying.label(combination)}: {len(requests)} requests")
        with clean_errors(), engine_logs():
            return run_engine(model, requests, knobs, warmup=True)

    points = varying.run_grid(varies, base, run, on_point=lambda point: _echo_result(point.result))
    typer.echo(varying.ratio_table(points, varies))
    if any(point.outputs_match is False for point in points):
        typer.echo("note: some points' greedy output tokens differ from the first combination's", err=True)
    if output_json is not None:
        output_json.parent.mkdir(parents=True, exist_ok=True)
        document = {"varied": {v.knob: list(v.values) for v in varies}, "points": [p.to_json() for p in points]}
        output_json.write_text(json.dumps(document, indent=2) + "\n")


def _echo_result(result: ThroughputResult) -> None:
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
    if result.median_tpot_ms is not None:
        typer.echo(f"TPOT: mean {result.mean_tpot_ms:.2f} ms, median {result.median_tpot_ms:.2f} ms per request")
    if result.acceptance_rate is not None:
        per_position = " ".join(f"{r:.2f}" for r in result.acceptance_rate_per_position or [])
        typer.echo(f"Speculation: acceptance {result.acceptance_rate:.2f}, mean acceptance length "
                   f"{result.mean_acceptance_length:.2f}, per position {per_position}")  # fmt: skip
    if result.tp_step_ms is not None:
        typer.echo(tensor_parallel_line(result))


def prepare_model(
    model: str = typer.Argument("smollm2-135m", help="Model alias, HF dir, .gguf file or hub id."),
) -> None:
    """Resolve a model, convert/cache its weights and tokenizer, and print where they are."""
    from engine.model_files import resolve_model
    from engine.tokenizer import get_tokenizer

    with clean_errors():
        path = resolve_model(model)
        get_tokenizer(str(path) if model not in ("smollm2-135m", "tiny-random") else model)
    typer.echo(str(path))


@contextmanager
def engine_logs() -> Iterator[None]:
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
def clean_errors() -> Iterator[None]:
    """Bad input (a missing model, an impossible knob) ends the command with its message, not a traceback."""
    from engine.config import ConfigError
    from engine.model_files import ModelNotFoundError

    try:
        yield
    except (ModelNotFoundError, ConfigError, ValueError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from error


