"""`bench compare-llama-cpp`: `bench serve` at each --quantization against llama.cpp's OpenAI server on the same
GGUF, driven by the same client (`bench sweep`), side by side in one run.

Every round starts each target in turn (the built-in engine at each setting, then llama.cpp's server from the
`llama-cpp-python[server]` package), runs one `bench sweep` point per concurrency against it and stops it, so no
idle server shares the cores with the one measured and the targets are interleaved round by round. A point's
figure is the median over the rounds of its median TPOT and its output tok/s; the table gives each target's
ratio to llama.cpp's (TPOT: ours / theirs, so <= 1.0 matches llama.cpp; throughput: ours / theirs).

llama.cpp's server takes no `ignore_eos`: its outputs may end at EOS before --output-len (its TPOT is per token
all the same; the mean output length is in the table). It runs one request at a time, started with
`--interrupt_requests False` so concurrent streams queue rather than interrupt each other (see
tests/sweep/test_llama_cpp_server.py). Its token counts come from re-tokenising the streamed text.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import typer

from sweep.run.launcher import ServerProcess, free_port, launch

REPO = Path(__file__).resolve().parent.parent
LLAMA_CPP = "llama.cpp"


@dataclass
class ComparePoint:
    target: str  # "bench serve --quantization Q" or "llama.cpp"
    concurrency: int
    median_tpot_ms: float  # median over the rounds of each round's median TPOT
    output_throughput: float  # output tok/s, median over the rounds
    mean_output_tokens: float
    rounds: list[dict[str, float]]
    tpot_ratio: float | None = None  # to llama.cpp's at the same concurrency (<= 1.0: as fast or faster)
    throughput_ratio: float | None = None


def llama_cpp_command(gguf: Path, alias: str, port: int, threads: int, n_ctx: int) -> list[str]:
    return [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", alias,
            "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx), "--n_threads", str(threads),
            "--n_threads_batch", str(threads), "--interrupt_requests", "False"]  # fmt: skip


def run_sweep(url: str, model: str, concurrency: list[int], num_prompts: int, input_len: int, output_len: int,
              out: Path) -> list[dict[str, Any]]:  # fmt: skip
    """One `bench sweep` (the same client for every target); its points."""
    import sweep

    command = [sys.executable, "-m", "cli", "sweep", "--url", url, "--model", model, "--tokenizer", model,
               "--concurrency", ",".join(map(str, concurrency)), "--num-prompts", str(num_prompts),
               "--num-warmups", "1", "--input-len", str(input_len), "--output-len", str(output_len),
               "--temperature", "0", "--no-report", "--no-calibration", "--output-dir", str(out)]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"bench sweep against {url} failed:\n{done.stderr[-3000:]}")
    points = sweep.load_results(out).points
    return points.to_dict("records")


def start_target(target: str, model: str, gguf: Path, threads: int | None, n_ctx: int, log: Path) -> ServerProcess:
    if target == LLAMA_CPP:
        port = free_port()
        command = llama_cpp_command(gguf, model, port, threads or 2, n_ctx)
        server = ServerProcess(command=command, host="127.0.0.1", port=port, log_path=log, health_path="/v1/models")
        return server.start()
    knobs: dict[str, Any] = {"quantization": target, "max_model_len": n_ctx}
    if threads is not None:
        knobs["cpu_threads"] = threads
    return launch(model, knobs, log).start()


def compare(model: str, gguf: Path, settings: list[str], concurrency: list[int], num_prompts: int, input_len: int,
            output_len: int, rounds: int, threads: int | None, output_dir: Path,
            echo: Any = print) -> list[ComparePoint]:  # fmt: skip
    targets = [*settings, LLAMA_CPP]
    n_ctx = input_len + output_len + 64
    per_round: dict[tuple[str, int], list[dict[str, float]]] = {}
    for r in range(rounds):
        for target in targets:
            name = target.replace(".", "")
            server = start_target(target, model, gguf, threads, n_ctx, output_dir / f"{name}-r{r}" / "server.log")
            try:
                points = run_sweep(server.url, model, concurrency, num_prompts, input_len, output_len,
                                   output_dir / f"{name}-r{r}" / "sweep")
            finally:
                server.stop()
            for point in points:
                row = {"median_tpot_ms": float(point["median_tpot_ms"]),
                       "output_throughput": float(point["output_throughput"]),
                       "mean_output_tokens": float(point["total_output_tokens"]) / max(int(point["completed"]), 1)}
                level = int(point["max_concurrency"])
                per_round.setdefault((target, level), []).append(row)
                echo(f"round {r} {target:>9} c={level:>2}: TPOT {row['median_tpot_ms']:.1f} ms, "
                     f"{row['output_throughput']:.1f} output tok/s")
    results = [
        ComparePoint(target, c, statistics.median(x["median_tpot_ms"] for x in rows),
                     statistics.median(x["output_throughput"] for x in rows),
                     statistics.mean(x["mean_output_tokens"] for x in rows), rows)
        for (target, c), rows in per_round.items()
    ]  # fmt: skip
    for point in results:
        ref = next(p for p in results if p.target == LLAMA_CPP and p.concurrency == point.concurrency)
        point.tpot_ratio = point.median_tpot_ms / ref.median_tpot_ms
        point.throughput_ratio = point.output_throughput / ref.output_throughput
    return sorted(results, key=lambda p: (p.concurrency, targets.index(p.target)))


def format_table(results: list[ComparePoint]) -> str:
    lines = ["| target | concurrency | median TPOT ms | vs llama.cpp | output tok/s | vs llama.cpp | mean out tokens |",
             "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for p in results:
        target = LLAMA_CPP + " (Q4_1 GGUF)" if p.target == LLAMA_CPP else f"bench serve --quantization {p.target}"
        lines.append(f"| {target} | {p.concurrency} | {p.median_tpot_ms:.1f} | {p.tpot_ratio:.2f}x | "
                     f"{p.output_throughput:.1f} | {p.throughput_ratio:.2f}x | {p.mean_output_tokens:.0f} |")
    return "\n".join(lines)


def compare_llama_cpp(
    model: str = typer.Option("smollm2-135m", help="Model alias whose GGUF both servers load."),
    settings: str = typer.Option("none,int8,int4", help="Comma-separated `bench serve --quantization` settings."),
    concurrency: str = typer.Option("1", help="Comma-separated concurrencies (one sweep point each)."),
    num_prompts: int = typer.Option(8, help="Requests per point."),
    input_len: int = typer.Option(256, help="Prompt tokens."),
    output_len: int = typer.Option(128, help="Output tokens (llama.cpp may stop earlier at EOS)."),
    rounds: int = typer.Option(2, help="Interleaved rounds over the targets (the median is reported)."),
    threads: int | None = typer.Option(None, help="Both servers' threads [default: torch's for ours, 2 for "
                                       "llama.cpp]."),
    output_dir: Path = typer.Option(Path("compare-llama-cpp"), help="Run directories, logs and results.json."),
) -> None:
    """TPOT and output tok/s of `bench serve` at each quantization against llama.cpp's server, same GGUF."""
    from engine.model_files import smollm2_gguf_path

    if rounds < 1 or num_prompts < 1 or input_len < 1 or output_len < 2:
        raise typer.BadParameter("--rounds, --num-prompts, --input-len must be >= 1, --output-len >= 2")
    if model != "smollm2-135m":
        raise typer.BadParameter("only the default model's GGUF (smollm2-135m) is wired up for llama.cpp")
    try:
        import llama_cpp.server  # noqa: F401
    except ImportError as err:
        raise typer.BadParameter(f"llama.cpp's server is not installed (pip install 'llama-cpp-python[server]'): "
                                 f"{err}") from None
    levels = [int(c) for c in concurrency.split(",")]
    results = compare(model, smollm2_gguf_path(), [s.strip() for s in settings.split(",")], levels, num_prompts,
                      input_len, output_len, rounds, threads, output_dir, echo=typer.echo)
    typer.echo(format_table(results))
    (output_dir / "results.json").write_text(json.dumps([asdict(p) for p in results], indent=2) + "\n")
