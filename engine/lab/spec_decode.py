"""`bench spec-decode` (hidden; now `bench throughput --vary num_speculative_tokens=0,2,4,6 --vary
max_num_seqs=1,8 --temperature 0`): output tok/s and TPOT with and without n-gram speculation, side by side.

For each num_speculative_tokens K (0 = no speculation) one engine is built, warmed up, and serves the same requests
at each concurrency (a closed loop: a new request enters as soon as one finishes). Requests are greedy, so every K
must give the same tokens (`outputs_match` checks it) and the runs do the same work. Per point: output tokens per
second over the run, TPOT per request ((finish - first token) / (output tokens - 1), on the engine loop's clock),
the speedup over K = 0 at the same concurrency, and vLLM's acceptance figures from the engine's spec-decode
counters: acceptance rate = accepted / draft tokens, mean acceptance length = 1 + accepted / drafts, and per draft
position i the fraction of drafts whose token i was accepted.

Workloads: a text workload (`copy-heavy`: prompts that ask to repeat, edit or summarise a passage, sent through
the model's chat template; EOS ends a request), or a length workload such as the LMSYS mix (random-token prompts of
its lengths as in `bench throughput`, EOS ignored).
"""

from __future__ import annotations

import json
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import typer

from engine.benchmarks.throughput_run import acceptance
from engine.cli_options import knob_option, with_engine_knobs


@dataclass
class SpecDecodePoint:
    num_speculative_tokens: int  # 0: no speculation
    concurrency: int
    num_requests: int
    total_output_tokens: int
    elapsed_time: float
    output_tokens_per_second: float
    mean_tpot_ms: float
    median_tpot_ms: float
    speedup: float | None = None  # output tok/s over K = 0 at the same concurrency
    outputs_match: bool | None = None  # token-identical to K = 0
    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    acceptance_rate_per_position: list[float] = field(default_factory=list)


@dataclass
class _Prompt:
    token_ids: list[int]
    max_tokens: int


def run_closed_loop(engine: Any, prompts: Sequence[_Prompt], params: Callable[[int], Any], concurrency: int,
                    tag: str, progress: Callable[[], None]) -> tuple[float, list[list[int]], list[float]]:  # fmt: skip
    """Serve `prompts` keeping `concurrency` in flight; returns the elapsed time, each request's tokens and TPOTs."""
    pending = deque(range(len(prompts)))
    first_token: dict[int, float] = {}
    tokens: list[list[int]] = [[] for _ in prompts]
    tpots: list[float] = []
    in_flight = 0
    start = time.perf_counter()
    while pending or engine.has_unfinished_requests():
        while pending and in_flight < concurrency:
            index = pending.popleft()
            engine.add_request(f"{tag}-{index}", prompts[index].token_ids, params(prompts[index].max_tokens))
            in_flight += 1
        outputs = engine.step()
        now = time.perf_counter()
        for output in outputs:
            index = int(output.request_id.rsplit("-", 1)[1])
            completion = output.outputs[0]
            if completion.token_ids and index not in first_token:
                first_token[index] = now
            if output.finished:
                tokens[index] = list(completion.token_ids)
                if len(tokens[index]) > 1:
                    tpots.append((now - first_token[index]) / (len(tokens[index]) - 1))
                in_flight -= 1
                progress()
    return time.perf_counter() - start, tokens, tpots


def measure(model: str, prompts: list[_Prompt], ks: list[int], concurrencies: list[int], knobs: dict[str, Any],
            ignore_eos: bool, prompt_lookup: tuple[int, int]) -> list[SpecDecodePoint]:  # fmt: skip
    import copy

    from rich.progress import Progress

    from engine import LLM, SamplingParams

    def params(max_tokens: int) -> SamplingParams:
        return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos)

    points: list[SpecDecodePoint] = []
    reference: dict[int, list[list[int]]] = {}
    with Progress(transient=False) as bar:
        task = bar.add_task("spec-decode runs", total=len(ks) * len(concurrencies) * len(prompts))
        for k in ks:
            spec = None
            if k > 0:
                spec = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": prompt_lookup[0],
                        "prompt_lookup_max": prompt_lookup[1]}  # fmt: skip
            llm = LLM(model, **{**knobs, "speculative_config": spec})
            engine = llm.llm_engine
            run_closed_loop(engine, prompts[:1], lambda _: params(8), 1, "warmup", lambda: None)
            for concurrency in concurrencies:
                before = copy.deepcopy(engine.get_stats().spec_decoding_stats)
                elapsed, tokens, tpots = run_closed_loop(
                    engine, prompts, params, concurrency, f"k{k}c{concurrency}", lambda: bar.advance(task)
                )
                rate, length, per_pos = acceptance(before, engine.get_stats().spec_decoding_stats)
                total = sum(len(t) for t in tokens)
                point = SpecDecodePoint(
                    k, concurrency, len(prompts), total, elapsed, total / elapsed,
                    1000 * statistics.fmean(tpots) if tpots else 0.0,
                    1000 * statistics.median(tpots) if tpots else 0.0,
                    acceptance_rate=rate, mean_acceptance_length=length, acceptance_rate_per_position=per_pos,
                )  # fmt: skip
                if k == 0:
                    reference[concurrency] = tokens
                elif concurrency in reference:
                    point.outputs_match = tokens == reference[concurrency]
                points.append(point)
                bar.console.print(
                    f"K={k} concurrency={concurrency}: {point.output_tokens_per_second:.1f} output tok/s, "
                    f"mean TPOT {point.mean_tpot_ms:.1f} ms, acceptance {point.acceptance_rate}"
                )
            del llm, engine
    baseline = {p.concurrency: p.output_tokens_per_second for p in points if p.num_speculative_tokens == 0}
    for point in points:
        if point.concurrency in baseline:
            point.speedup = point.output_tokens_per_second / baseline[point.concurrency]
    return points


def render_table(points: list[SpecDecodePoint]) -> str:
    lines = ["| concurrency | K | output tok/s | speedup | mean TPOT ms | acceptance | mean accepted length | "
             "acceptance per position | same tokens as K=0 |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for p in sorted(points, key=lambda p: (p.concurrency, p.num_speculative_tokens)):
        per_pos = " ".join(f"{r:.2f}" for r in p.acceptance_rate_per_position) or "-"
        lines.append(
            f"| {p.concurrency} | {p.num_speculative_tokens or 'off'} | {p.output_tokens_per_second:.1f} | "
            f"{p.speedup:.2f}x | {p.mean_tpot_ms:.1f} | "
            f"{'-' if p.acceptance_rate is None else f'{p.acceptance_rate:.2f}'} | "
            f"{'-' if p.mean_acceptance_length is None else f'{p.mean_acceptance_length:.2f}'} | {per_pos} | "
            f"{'-' if p.outputs_match is None else 'yes' if p.outputs_match else 'NO'} |"
            if p.speedup is not None
            else f"| {p.concurrency} | {p.num_speculative_tokens} | {p.output_tokens_per_second:.1f} | - | "
            f"{p.mean_tpot_ms:.1f} | - | - | {per_pos} | - |"
        )
    return "\n".join(lines)


def _int_list(text: str, option: str, minimum: int) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise typer.BadParameter(f"{option} must be comma-separated integers, got {text!r}") from None
    if not values or any(v < minimum for v in values):
        raise typer.BadParameter(f"{option} must be integers >= {minimum}, got {text!r}")
    return values


@with_engine_knobs
def spec_decode(
    ctx: typer.Context,
    engine_knobs: dict[str, Any],
    model: str = knob_option("model", "smollm2-135m", help="Model alias, HF dir, .gguf file or hub id."),
    workload: str = typer.Option("copy-heavy", help="copy-heavy (text), or a length workload such as lmsys."),
    num_prompts: int = typer.Option(8, help="Requests per run (each K and concurrency serves the same ones)."),
    output_len: int = typer.Option(128, help="Most output tokens per request."),
    num_speculative_tokens: str = typer.Option("0,2,4,6", help="Comma-separated K values; 0 = no speculation."),
    concurrency: str = typer.Option("1,8", help="Comma-separated concurrencies (requests in flight)."),
    prompt_lookup_min: int = typer.Option(2, help="Shortest n-gram prompt lookup matches."),
    prompt_lookup_max: int = typer.Option(4, help="Longest n-gram prompt lookup tries first."),
    seed: int = knob_option("seed", 0, help="Seed of the prompts and of the engine."),
    output_json: Path | None = typer.Option(None, help="Write the points here as JSON."),
) -> None:
    """N-gram speculative decoding against none, side by side: output tok/s, TPOT and acceptance per K.

    The engine knobs apply to every run except --speculative-config, which this command sets per K.
    """
    from engine.benchmarks.throughput import clean_errors
    from engine.benchmarks.throughput_run import chat_prompt_ids, make_requests
    from engine.tokenizer import get_tokenizer

    ks = _int_list(num_speculative_tokens, "--num-speculative-tokens", 0)
    concurrencies = _int_list(concurrency, "--concurrency", 1)
    if num_prompts < 1 or output_len < 1:
        raise typer.BadParameter("--num-prompts and --output-len must be >= 1")
    if not 1 <= prompt_lookup_min <= prompt_lookup_max:
        raise typer.BadParameter("--prompt-lookup-min must be >= 1 and <= --prompt-lookup-max")
    if "speculative_config" in engine_knobs:
        raise typer.BadParameter("--speculative-config is set per run by --num-speculative-tokens")
    loaders = ctx.obj
    if loaders is None:
        raise typer.BadParameter("bench spec-decode needs the workloads package, which this `bench` was built without")
    load_workload, load_texts = loaders
    tokenizer = get_tokenizer(engine_knobs.get("tokenizer") or model)
    with clean_errors():
        if workload == "copy-heavy":
            texts = load_texts(workload, num_requests=num_prompts, seed=seed, output_len=output_len)
            prompts = [_Prompt(chat_prompt_ids(tokenizer, t.prompt), t.output_len) for t in texts]
            ignore_eos = False
        else:
            from engine.config import model_context_length

            max_len = engine_knobs.get("max_model_len") or model_context_length(model)
            specs = load_workload(workload, num_requests=num_prompts, seed=seed, max_model_len=max_len)
            lengths = [(s.input_len, min(s.output_len, output_len)) for s in specs]
            requests = make_requests(tokenizer, num_prompts, lengths, len(tokenizer), seed)
            prompts = [_Prompt(r.prompt_token_ids, r.output_len) for r in requests]
            ignore_eos = True
        points = measure(model, prompts, ks, concurrencies, {**engine_knobs, "seed": seed}, ignore_eos,
                         (prompt_lookup_min, prompt_lookup_max))  # fmt: skip
    typer.echo(f"bench spec-decode: {model}, workload {workload}, {num_prompts} requests per run, greedy")
    typer.echo(render_table(points))
    if output_json is not None:
        output_json.parent.mkdir(parents=True, exist_ok=True)
        output_json.write_text(json.dumps([asdict(p) for p in points], indent=2) + "\n")

